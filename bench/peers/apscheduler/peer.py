#!/usr/bin/env python3
"""APScheduler 3.11 peer for belfry-bench: the same workload, measured by the
same receiver.

Schedules N one-shot jobs in APScheduler's durable SQLAlchemy job store on
SQLite (one committed transaction per add_job, SQLite's default
synchronous=FULL rollback journal), each POSTing the same kind of body to
URL. Every delivery carries `X-Belfry-Event-Id` and `X-Belfry-Scheduled-At`
(ms since the epoch), so `belfry-bench receive` computes lateness exactly as
it does for Belfry.

Due instants: `--lead-s` after the start of scheduling, spread uniformly
over `--spread-s` (0 = all due at once: the burst case). The script prints
its ingest rate (acknowledged = add_job returned, i.e. committed), then
waits until every job ran and exits.

    python peer.py --url http://127.0.0.1:9090/hook --count 2000 \
        --lead-s 60 --spread-s 10 --db /tmp/aps.sqlite
"""

import argparse
import json
import os
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import requests
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler

_session = threading.local()
_done = threading.Semaphore(0)
_url = None


def deliver(event_id, scheduled_ms, payload):
    """The job: one POST, on a keep-alive session per executor thread."""
    session = getattr(_session, "s", None)
    if session is None:
        session = _session.s = requests.Session()
    body = json.dumps({"id": event_id, "payload": payload})
    try:
        session.post(
            _url,
            data=body,
            headers={
                "Content-Type": "application/json",
                "X-Belfry-Event-Id": event_id,
                "X-Belfry-Scheduled-At": str(scheduled_ms),
            },
            timeout=10,
        )
    except requests.RequestException as error:  # counted as missing by the receiver
        print(f"delivery of {event_id} failed: {error}", file=sys.stderr)
    finally:
        _done.release()


def main():
    global _url
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="receiver URL (belfry-bench receive)")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--lead-s", type=float, default=30.0)
    parser.add_argument("--spread-s", type=float, default=10.0)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--db", default="apscheduler-peer.sqlite", help="SQLite file (deleted first)")
    parser.add_argument("--workers", type=int, default=20, help="executor threads")
    args = parser.parse_args()
    _url = args.url

    if os.path.exists(args.db):
        os.remove(args.db)
    scheduler = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(url=f"sqlite:///{args.db}")},
        executors={"default": ThreadPoolExecutor(args.workers)},
        # Late jobs still run (and are measured as late) instead of being
        # skipped; never coalesce distinct events.
        job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 1},
        timezone=timezone.utc,
    )
    scheduler.start()

    payload = "x" * args.payload_bytes
    start = time.time()
    first_due = start + args.lead_s
    scheduling_started = time.perf_counter()
    for n in range(args.count):
        due = first_due + (n * args.spread_s / args.count)
        due_ms = int(due * 1000)
        scheduler.add_job(
            deliver,
            trigger="date",
            run_date=datetime.fromtimestamp(due_ms / 1000, tz=timezone.utc),
            args=[f"e{n}", due_ms, payload],
            id=f"e{n}",
        )
        if n and n % 500 == 0:
            rate = n / (time.perf_counter() - scheduling_started)
            print(f"scheduled {n}/{args.count} ({rate:.0f} jobs/s)", file=sys.stderr)
    seconds = time.perf_counter() - scheduling_started
    finished = time.time()
    report = {
        "peer": "apscheduler-3.11-sqlalchemy-sqlite",
        "count": args.count,
        "ingest_seconds": round(seconds, 3),
        "ingest_events_per_s": round(args.count / seconds, 1),
        "ingest_overran_first_due_by_s": round(max(0.0, finished - first_due), 3),
    }
    print(json.dumps(report), flush=True)

    for _ in range(args.count):
        _done.acquire()
    scheduler.shutdown(wait=True)


if __name__ == "__main__":
    main()
