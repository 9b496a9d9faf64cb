"""The time of a page of 100 jobs of ``GET /jobs``'s read, by sort and filter, ten pages each,
on a state of N jobs (default 200,000): the node's Reader over a real SQLite file.

    PYTHONPATH=. .venv/bin/python scripts/benchlib/list_sorted.py [N]"""

import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from schedd import clock
from schedd.core import commands
from schedd.core.model import JobSort
from schedd.core.validate import parse_job
from schedd.ids import new_job_id, new_request_id
from schedd.storage.reader import JobOrder, Reader
from schedd.storage.sqlstate import SqlState, apply_entry

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000


async def main() -> None:
    rnd = random.Random(7)
    now = clock.wall_ms()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        st = SqlState(path)
        apply_entry(st, commands.encode_entry([commands.Claim("c", now, "n1", 1)]), 1)
        idx = 1
        for _k in range(N // 1000):
            jobs = tuple(
                (
                    new_job_id(now),
                    parse_job(
                        {
                            "task": f"t{rnd.randrange(50)}",
                            "schedule": {"in": f"{rnd.randrange(1, 10**6)}s"},
                        },
                        now_ms=now,
                    ),
                )
                for _ in range(1000)
            )
            idx += 1
            apply_entry(
                st, commands.encode_entry([commands.Submit(new_request_id(), now, jobs)]), idx
            )
        st.commit() if st.in_transaction else None
        reader = Reader(path)
        await reader.open()
        for sort in JobSort:
            for filters in ({}, {"task": "t7"}, {"status": "active"}):
                order = JobOrder(sort)
                times = []
                cursor = None
                for _page in range(10):
                    t0 = time.perf_counter()
                    jobs, nxt = await reader.jobs_page(100, filters, order, cursor)
                    times.append(1000 * (time.perf_counter() - t0))
                    if nxt is None:
                        break
                    cursor = order.parse_cursor(nxt)
                print(
                    f"{sort.value:10} {filters!s:22} page median {statistics.median(times):6.1f} ms  max {max(times):6.1f} ms  ({len(jobs)} on the last)"
                )
        await reader.close()
        st.close()


asyncio.run(main())
