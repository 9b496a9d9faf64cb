// Log in: paste a token. It is kept in this tab's sessionStorage only and sent as a bearer
// token with each API call; no cookie is ever set.

import { fill, h } from "../dom.js";

export function loginScreen(main, { message, onToken }) {
  const input = h("input", {
    type: "password",
    id: "token",
    name: "token",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    placeholder: "paste a token",
  });
  const form = h(
    "form",
    { class: "login", id: "login" },
    h("h1", {}, "schedd"),
    h("p", {}, "Paste an API token (its role decides what you may do here). It stays in this ",
      "tab only and is forgotten when the tab closes."),
    h("label", { for: "token" }, "Token"),
    input,
    h("button", { type: "submit" }, "Log in"),
    message ? h("p", { class: "error", role: "alert" }, message) : null,
    h("p", { class: "muted" }, "Or run ", h("code", {}, "schedctl ui"),
      ": it opens this page logged in with a one-time link. Each node writes an admin token to the tokens file its banner names (",
      h("code", {}, "auth.tokens_file"), ")."),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const secret = input.value.trim();
    if (secret) onToken(secret);
  });
  fill(main, form);
  input.focus();
  return { destroy() {} };
}
