"""Carry out a plan's scenarios against the proxy and record the client-side history.

Each worker thread owns one confluent-kafka producer (idempotent, acks=all) bootstrapped at the
proxy's Kafka listener, and the scenarios the plan dealt it. A scenario's steps run one after
the other: a step is sent ``after_s`` after the previous one was answered (its delivery
report, or its HTTP answer), so one id's history is sequential; ids run concurrently. HTTP calls
go to a shared thread pool so a confirmed cancel's wait blocks no producer.

Threads: the worker thread produces and polls; delivery reports run in its poll; HTTP answers
run in pool threads. Both append to the history and to the worker's ready heap under
:attr:`Runner.lock`. A send that is never acknowledged (a proxy killed under it, a fatal
producer error) is recorded as ``error``: not promised, judged only for what is never allowed.
"""

from __future__ import annotations

import heapq
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from bench.chaos.history import History, Op
from bench.chaos.plan import LEVEL_MS, Scenario, Step
from kdelay import headers as h

PAYLOAD = "chaos|"
HTTP_TIMEOUT_S = 30.0
CONFIRM_WAIT_S = 10


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Run:
    """A scenario in progress: the next step's index and the ids it writes."""

    index: int
    scenario: Scenario
    step: int = 0


@dataclass
class _Worker:
    fatal: threading.Event
    producer: Producer
    heap: list[tuple[float, int, _Run]] = field(default_factory=list)
    left: int = 0


class Runner:
    """Runs ``scenarios`` from ``t0`` (time.monotonic) on ``workers`` threads."""

    def __init__(self, proxy: str, http: str, topics: list[str], seed: int, workers: int) -> None:
        self.proxy, self.http, self.topics, self.seed = proxy, http, topics, seed
        self.history = History()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="chaos-http")
        fatals = [threading.Event() for _ in range(workers)]
        self.workers = [_Worker(fatal, self._producer(fatal)) for fatal in fatals]
        self.errors: dict[str, int] = {}
        self._seq = 0

    def _producer(self, fatal: threading.Event) -> Producer:
        def on_error(err: KafkaError) -> None:
            if err.fatal():
                fatal.set()

        conf: dict[str, Any] = {
            "bootstrap.servers": self.proxy,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 30_000,
            "log_level": 0,
            "error_cb": on_error,
        }
        return Producer(conf)

    # ---- scheduling -------------------------------------------------------------------------

    def _push(self, worker: _Worker, at: float, run: _Run) -> None:
        with self.lock:
            self._seq += 1
            heapq.heappush(worker.heap, (at, self._seq, run))

    def _finished(self, worker: _Worker, run: _Run, steps_done: int) -> None:
        """The step ``steps_done - 1`` was answered: queue the next one, or end the scenario."""
        run.step = steps_done
        if run.step < len(run.scenario.steps):
            self._push(worker, time.monotonic() + run.scenario.steps[run.step].after_s, run)
        else:
            with self.lock:
                worker.left -= 1

    def run(self, scenarios: tuple[Scenario, ...], t0: float, deadline: float) -> None:
        """Run every scenario; returns when all were answered or at ``deadline`` (monotonic)."""
        for index, sc in enumerate(scenarios):
            worker = self.workers[sc.worker % len(self.workers)]
            worker.left += 1
            self._push(worker, t0 + sc.start_s, _Run(index, sc))
        threads = [
            threading.Thread(target=self._loop, args=(w, deadline), name=f"chaos-worker-{i}")
            for i, w in enumerate(self.workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _loop(self, worker: _Worker, deadline: float) -> None:
        while time.monotonic() < deadline:
            with self.lock:
                if worker.left <= 0:
                    break
                due = bool(worker.heap) and worker.heap[0][0] <= time.monotonic()
                run = heapq.heappop(worker.heap)[2] if due else None
            if worker.fatal.is_set():
                self._count("producer fatal error: replaced")
                worker.producer.purge()
                worker.producer.poll(1)
                worker.producer = self._producer(worker.fatal)
                worker.fatal.clear()
            if run is not None:
                self._start(worker, run)
            worker.producer.poll(0.01 if run is None else 0)
        worker.producer.flush(35)

    def _count(self, what: str) -> None:
        with self.lock:
            self.errors[what] = self.errors.get(what, 0) + 1

    # ---- one step -----------------------------------------------------------------------------

    def _ids(self, run: _Run) -> list[str]:
        """The ids the current step acts on: a bulk cancel's whole group."""
        sc, step = run.scenario, run.scenario.steps[run.step]
        if sc.group:
            return list(sc.group) if step.kind.startswith("bulk") else [sc.group[run.step]]
        return [sc.msg_id]

    def _start(self, worker: _Worker, run: _Run) -> None:
        sc, step = run.scenario, run.scenario.steps[run.step]
        ids = self._ids(run)
        token = f"c{self.seed}-{run.index}.{run.step}"
        key = ids[0] or f"noid:{token}"
        topic = self.topics[sc.topic]
        writes = step.kind not in ("status", "list") and not step.kind.startswith(
            ("cancel", "bulk")
        )
        ops = []
        with self.lock:
            sent = now_ms()
            for msg_id in [key] if not sc.group or not step.kind.startswith("bulk") else ids:
                op = Op(step.kind, msg_id, sent, topic=topic, token=token if writes else None)
                if step.repeat is not None:
                    op.repeat_count, op.period_ms = step.repeat[0], step.repeat[1] * 1000
                ops.append(self.history.add(op))
        steps_done = run.step + 1
        if step.kind in ("immediate", "delayed_noid", "delayed_header", "series_header") or (
            step.kind in ("replace_header", "cancel_header")
        ):
            self._produce(worker, run, ops[0], ids[0], steps_done)
        else:
            fut = self.pool.submit(self._http, step, ids[0], sc, ops[0])
            fut.add_done_callback(lambda f: self._answered(worker, run, ops, f, steps_done))

    def _timing(self, step: Step, op: Op) -> tuple[str, str, int]:
        """(header, value, delay ms or 0) of a step's timing; sets the op's lower due bound."""
        if step.timing == "deliver_at":
            at = op.sent_ms + step.value_ms
            op.due_lo = op.due_hi = at
            return h.DELIVER_AT, str(at), 0
        if step.timing == "level":
            op.due_lo = op.sent_ms + LEVEL_MS[step.value_ms]
            return h.DELAY_LEVEL, str(step.value_ms), LEVEL_MS[step.value_ms]
        op.due_lo = op.sent_ms + step.value_ms
        return h.DELAY_MS, str(step.value_ms), step.value_ms

    def _produce(self, worker: _Worker, run: _Run, op: Op, msg_id: str, steps_done: int) -> None:
        step = run.scenario.steps[run.step]
        headers: list[tuple[str, str | bytes | None]] = []
        delay = 0
        if step.kind == "cancel_header":
            headers.append((h.CANCEL, msg_id.encode()))
        elif step.kind == "immediate":
            op.due_lo = op.sent_ms
        else:
            name, value, delay = self._timing(step, op)
            headers.append((name, value.encode()))
            if msg_id:
                headers.append((h.ID, msg_id.encode()))
        if step.kind == "replace_header":
            headers.append((h.REPLACE, b"true"))
        if step.repeat is not None:
            headers.append((h.REPEAT, f"R{step.repeat[0]}/PT{step.repeat[1]}S".encode()))
        payload = (PAYLOAD + op.token).encode() if op.token else b""

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            with self.lock:
                op.done_ms = now_ms()
                op.outcome = "ok" if err is None else "error"
                op.answer = "" if err is None else err.name()
                if op.due_lo is not None and op.due_hi is None:
                    op.due_hi = op.done_ms + delay
            self._finished(worker, run, steps_done)

        try:
            worker.producer.produce(
                op.topic or "",
                payload,
                (msg_id or op.msg_id).encode(),
                headers=headers,
                on_delivery=on_delivery,
            )
        except BufferError:
            on_delivery(KafkaError(KafkaError._QUEUE_FULL), None)  # type: ignore[arg-type]

    def _http(self, step: Step, msg_id: str, sc: Scenario, op: Op) -> tuple[int | None, str, int]:
        """(status or None, answer, delay ms) of one HTTP call."""
        base = f"{self.http}/v1/messages"
        quoted = urllib.parse.quote(msg_id, safe="")
        delay, body, method, url = 0, None, "GET", f"{base}/{quoted}"
        if step.kind in ("delayed_http", "replace_http", "replace_series_http"):
            doc: dict[str, Any] = {
                "topic": op.topic,
                "key": msg_id,
                "value": PAYLOAD + str(op.token),
            }
            name, value, delay = self._timing(step, op)
            field_name = {h.DELIVER_AT: "deliver_at", h.DELAY_LEVEL: "delay_level"}
            doc[field_name.get(name, "delay_ms")] = int(value)
            if step.repeat is not None:
                doc["repeat"] = f"R{step.repeat[0]}/PT{step.repeat[1]}S"
            method = "POST" if step.kind == "delayed_http" else "PUT"
            if method == "POST":
                doc["id"], url = msg_id, base
            body = json.dumps(doc).encode()
        elif step.kind in ("cancel_http", "cancel_confirmed"):
            method = "DELETE"
            url += f"?wait={CONFIRM_WAIT_S}" if step.kind == "cancel_confirmed" else ""
        elif step.kind.startswith("bulk"):
            method = "DELETE"
            url = f"{base}?id_prefix={urllib.parse.quote(sc.msg_id + '-b')}"
            url += f"&wait={CONFIRM_WAIT_S}" if step.kind.endswith("confirmed") else ""
        elif step.kind == "list":
            url = f"{base}?state=pending&limit=20"
        req = urllib.request.Request(url, data=body, method=method)  # noqa: S310 - loopback
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
                return resp.status, resp.read(300).decode(errors="replace"), delay
        except urllib.error.HTTPError as err:
            return err.code, err.read(300).decode(errors="replace"), delay
        except (OSError, ValueError) as err:
            return None, f"{type(err).__name__}: {err}"[:200], delay

    def _answered(
        self,
        worker: _Worker,
        run: _Run,
        ops: list[Op],
        fut: Future[tuple[int | None, str, int]],
        steps_done: int,
    ) -> None:
        try:
            status, answer, delay = fut.result()
        except Exception as err:  # noqa: BLE001 - a cancelled future at the deadline
            status, answer, delay = None, repr(err)[:200], 0
        with self.lock:
            done = now_ms()
            for op in ops:
                op.done_ms, op.status = done, status
                op.answer = answer if status is None or status >= 300 else answer[:120]
                op.outcome = (
                    "error"
                    if status is None or status >= 500
                    else "ok"
                    if status < 300
                    else "refused"
                )
                if op.due_lo is not None and op.due_hi is None:
                    op.due_hi = done + delay
        self._finished(worker, run, steps_done)
