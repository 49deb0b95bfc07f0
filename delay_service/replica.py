"""One delay-service replica: ingest, election, and (as master) the forwarder.

Start-up order: internal topics exist -> store opens -> ingest starts -> first catch-up with
the end of the buffer topic -> only then the replica joins the election, as a follower; the
winner claims an epoch and the forwarder takes over (see forwarder.py). A follower applies each
checkpoint it sees once it has settled (follower_checkpoints.py), so its store holds only what
is not yet known to be delivered. The start-up steps are in startup.py; what the replica
publishes every status interval (its status znode, gauges) in status.py.

Threads and who calls what:
- main thread: :meth:`Replica.run` (start-up, then the *control loop*), :meth:`request_stop`
  from signal handlers;
- control loop (main thread): the only caller of the election, the registry and the
  forwarder's ``control`` (forwarder_control.py); it reacts to ZooKeeper states (SUSPENDED ->
  pause, LOST -> step down, CONNECTED -> resume / rejoin), leadership changes and
  checkpoints, all handed over by kazoo callbacks through ``_events`` + ``_wakeup``
  (callbacks never block);
- ingest thread: :meth:`Ingest.run`; forwarder thread: :meth:`Forwarder.run`; both run under
  a :class:`SupervisedThreads`: a failure is logged, counted and the loop run again after a backoff;
  a failed forwarder first makes the replica step down (it leaves the election, and joins again
  only once the backoff is over), so a master never holds the election without forwarding;
  too many failures in a row stop the replica, and the process exits non-zero;
- clock skew (skew_step_down.py, on the control loop): a master held for clock skew longer than
  ``--skew-step-down-ms`` steps down when another replica stands; a replica whose clock is off
  stands only when nobody else does, and again once its clock has been right for a while;
- kazoo's threads run callbacks only; the HTTP port (``/metrics``, ``/healthz``, ``/readyz``,
  health.py, and the message queries of queries.py) answers on threads of its own and only
  reads thread-safe state (the store locks; a timeline scan takes its lock chunk by chunk).

Shutdown (SIGTERM/SIGINT): the forwarder finishes its round and writes a last checkpoint,
the replica leaves the election, ingest stops, RocksDB is flushed and closed, ZooKeeper last.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from kdelay import logs, memory
from kdelay.backoff import Backoff
from kdelay.checkpoint import CheckpointFormatError, CheckpointRecord
from kdelay.delay_service import away, health, startup
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.errors import ComponentFailedError
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.follower_checkpoints import FollowerCheckpoints
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.release.forwarder_control import ForwarderControl
from kdelay.delay_service.release.skew_step_down import Leave, SkewCandidacy
from kdelay.delay_service.status import StatusPublisher, role
from kdelay.delay_service.store.store import Store
from kdelay.delay_service.threads import SupervisedThreads
from kdelay.errors import ConfigError
from kdelay.supervision import RestartPolicy
from kdelay.zk import (
    CONNECTED,
    LOST,
    SUSPENDED,
    CheckpointStore,
    CoordinationError,
    Election,
    Registry,
    Session,
)
from kdelay.zk.access import watch_data

log = logs.get(__name__)


class Replica:
    """A replica process; :meth:`run` blocks until :meth:`request_stop`."""

    def __init__(self, cfg: ReplicaConfig) -> None:
        self.cfg = cfg
        self.paths = cfg.set_paths
        self.metrics = Metrics()
        self.metrics.shard_info.labels(str(cfg.shard), str(cfg.shards)).set(1)
        self.metrics_url = ""
        self._stop = threading.Event()
        self._wakeup = threading.Event()
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._last_cp: CheckpointRecord | None = None
        self._follower_checkpoints = FollowerCheckpoints()  # a follower's, applied once settled
        self._joined = False
        self._skew = SkewCandidacy(
            cfg.max_clock_skew_ms, cfg.skew_step_down_ms, metrics=self.metrics
        )
        self.supervisor = SupervisedThreads(
            self.metrics,
            RestartPolicy(
                Backoff(cfg.restart_backoff_ms / 1000, cfg.restart_backoff_max_ms / 1000),
                max_failures=cfg.max_component_failures,
            ),
            on_fatal=self._on_fatal,
        )
        self.health = health.Health(cfg, self.supervisor, self._stop)

    def request_stop(self) -> None:
        """Ask the control loop to shut down (any thread: the stop-signal thread calls it)."""
        self._stop.set()
        self._wakeup.set()

    # -- callbacks from other threads: hand off, never block ---------------------------------

    def _on_leader(self, leader: bool) -> None:
        self._events.put(("leader", leader))
        self._wakeup.set()

    def _on_fenced(self, why: str) -> None:
        self._events.put(("fenced", why))
        self._wakeup.set()

    def _on_fatal(self, component: str) -> None:
        self.health.fatal = component
        self.request_stop()

    def _on_component_failed(self, component: str) -> None:
        self._events.put(("component_failed", component))
        self._wakeup.set()

    def _on_checkpoint(self, data: bytes | None, stat: Any) -> bool:
        if data:
            self._events.put(("checkpoint", (data, int(stat.version))))
            self._wakeup.set()
        return not self._stop.is_set()

    # -- main ------------------------------------------------------------------------------

    def run(self) -> None:
        cfg = self.cfg
        log.info("replica.starting", name=cfg.name, data_dir=str(cfg.data_dir))
        startup.ensure_topics(cfg)
        session = Session(
            cfg.zk_connect, cfg.zk_session_timeout, security=cfg, close_root=cfg.zk_root
        )
        session.wakeup = self._wakeup
        session.start(timeout=max(15.0, cfg.zk_session_timeout))
        try:
            startup.check_layout(cfg, session)  # before the store: a wrong --shards changes nothing
        except (ConfigError, CoordinationError):
            session.stop()
            raise
        startup.prepare_data_dir(cfg)  # rebuilt: a store of another shard, or away too long
        store = Store(cfg.data_dir / "store")
        self.metrics.pending.set(store.pending)
        self.health.beat()
        answers, self.metrics_url = startup.serve_http(cfg, self.metrics, self.health, store)
        startup.write_session_file(cfg, session)
        self.metrics.set_zk_state(CONNECTED)
        registry = Registry(session.client, self.paths, cfg.name)
        ingest = self.health.ingest = Ingest(cfg, store, self.metrics)
        forwarder, self.broker_clock = startup.start_forwarder(
            cfg, store, ingest, self.metrics, self._on_fenced
        )
        answers.attach(
            role=lambda: role(forwarder, ingest), lag=ingest.lag, clock=self.broker_clock.now_ms
        )
        ingest.on_new = forwarder.control.notify_new
        ingest.on_cancelled = forwarder.control.add_tombstones
        ingest.on_synced = away.SyncStamp(cfg.data_dir).synced
        ingest.leading = forwarder.active.is_set
        election = Election(session.client, self.paths, cfg.name, self._on_leader)
        ingest_stop = threading.Event()
        self._supervise(ingest, forwarder, ingest_stop)
        try:
            self._control(
                session=session,
                store=store,
                ingest=ingest,
                forwarder=forwarder,
                election=election,
                registry=registry,
            )
        finally:
            log.info("replica.stopping")
            self.supervisor.stop()
            forwarder.control.shutdown()
            self.supervisor.join("forwarder", timeout=60)
            self.broker_clock.close()
            election.leave()
            try:
                registry.withdraw()
            except CoordinationError as exc:
                log.warning("replica.status_not_withdrawn", error=str(exc))
            ingest_stop.set()
            self.supervisor.join("ingest", timeout=30)
            store.close()
            session.stop()
            log.info("replica.stopped")
        if self.health.fatal is not None:
            raise ComponentFailedError(
                f"the {self.health.fatal} thread failed {cfg.max_component_failures} times in a "
                "row (see supervisor.component_failed in the log); exiting for a restart"
            )

    def _supervise(
        self, ingest: Ingest, forwarder: Forwarder, ingest_stop: threading.Event
    ) -> None:
        def forwarder_failed(_exc: BaseException) -> None:
            forwarder.control.deactivate("forwarder failed")  # at once; the control loop steps down
            self._on_component_failed("forwarder")

        self.supervisor.start("ingest", lambda: ingest.run(ingest_stop))
        self.supervisor.start("forwarder", forwarder.run, on_failure=forwarder_failed)

    def _control(
        self,
        *,
        session: Session,
        store: Store,
        ingest: Ingest,
        forwarder: Forwarder,
        election: Election,
        registry: Registry,
    ) -> None:
        cfg = self.cfg
        status = StatusPublisher(cfg, self.metrics, self.metrics_url, self.broker_clock)
        self._joined = False
        state = CONNECTED
        next_status = 0.0
        next_trim = time.monotonic() + memory.TRIM_INTERVAL_S
        watching = False
        while not self._stop.is_set():
            self._wakeup.wait(timeout=0.2 if not ingest.caught_up.is_set() else 1.0)
            self._wakeup.clear()
            # From here, not from ingest: it keeps counting while ingest is stuck or gone.
            self.metrics.ingest_progress_age.set(self.health.beat() - ingest.last_progress())
            for change in session.changes():
                previous, state = state, change
                self.metrics.set_zk_state(state)
                log.info("replica.zookeeper_state", state=state, previous=previous)
                if state == SUSPENDED:
                    forwarder.control.pause()
                elif state == LOST:
                    forwarder.control.deactivate("zookeeper session lost")
                    election.forget()
                    self._joined = False
                elif state == CONNECTED:
                    if previous == LOST:
                        startup.write_session_file(cfg, session)
                        next_status = 0.0
                    forwarder.control.resume()
            if state == CONNECTED and not watching:
                watch_data(session.client, self.paths.checkpoint, self._on_checkpoint)
                watching = True
            self._skew.observe(
                time.monotonic(), self.broker_clock.skew_ms(), leading=election.is_leader
            )
            if state == CONNECTED and self._joined:
                self._leave_if_skewed(forwarder.control, election)
            if (
                state == CONNECTED
                and not self._joined
                and ingest.caught_up.is_set()
                and self.broker_clock.now_ms() is not None  # a master needs broker time
                and "forwarder" not in self.supervisor.backing_off()
                and self._skew.may_stand(time.monotonic(), lambda: _rivals(election))
            ):
                try:
                    election.join()
                    self._joined = True
                    log.info(
                        "replica.election_joined", node=election.node, skewed=self._skew.skewed
                    )
                except CoordinationError as exc:
                    log.warning("replica.election_join_failed", error=str(exc))
            self._drain_events(forwarder.control, election)
            apply_settled(self._follower_checkpoints, store, forwarder.control)
            self._reconcile(session, forwarder.control, election)
            if time.monotonic() >= next_trim:
                next_trim = time.monotonic() + memory.TRIM_INTERVAL_S
                memory.trim()
            if time.monotonic() >= next_status and state == CONNECTED:
                next_status = time.monotonic() + cfg.status_interval_ms / 1000
                status.publish(registry, store, ingest, forwarder, election, self._last_cp)

    def _leave_if_skewed(self, forwarder: ForwarderControl, election: Election) -> None:
        """Leave the election when this replica's clock says so (skew_step_down.py): a master
        stops forwarding first, then gives the election to the next candidate."""
        leave = self._skew.leave(
            time.monotonic(), leading=election.is_leader, rivals=lambda: _rivals(election)
        )
        if leave is None:
            return
        if leave is Leave.STEP_DOWN:
            forwarder.deactivate("stepped down: clock skew")
        election.leave()
        self._joined = False

    def _reconcile(self, session: Session, forwarder: ForwarderControl, election: Election) -> None:
        """Level-triggered: the forwarder runs exactly while we lead on a live session."""
        leader = election.is_leader and session.state == CONNECTED
        if leader and not forwarder.engaged:
            log.info("replica.election_won")
            forwarder.activate(CheckpointStore(session.client, self.paths, self.cfg.name))
        elif not election.is_leader and forwarder.engaged:
            forwarder.deactivate("lost leadership")

    def _drain_events(self, forwarder: ForwarderControl, election: Election) -> None:
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                return
            if kind == "leader":
                pass  # _reconcile below looks at the current leadership, not at edges
            elif kind == "component_failed":
                if payload == "forwarder" and self._joined:
                    # A master whose forwarder cannot run must not hold the election: step
                    # down; the control loop joins again once the restart backoff is over.
                    log.warning("replica.stepping_down", why="forwarder failed")
                    if election.is_leader:
                        self.metrics.step_downs.labels("forwarder_failed").inc()
                    election.leave()
                    self._joined = False
            elif kind == "fenced":
                log.warning("replica.deposed", why=payload)
                election.leave()
                self._joined = False  # the control loop joins again, retrying on failure
                forwarder.clear_fenced()
            elif kind == "checkpoint":
                data, version = payload
                try:
                    cp = CheckpointRecord.decode(data)
                except CheckpointFormatError as exc:
                    log.warning("replica.checkpoint_unreadable", error=str(exc))
                    continue
                self._last_cp = cp
                self._follower_checkpoints.seen(version, cp.checkpoint)


def apply_settled(settling: FollowerCheckpoints, store: Store, forwarder: ForwarderControl) -> None:
    """A follower applies each checkpoint once it has settled (follower_checkpoints.py says
    why). From the moment the control thread activates the forwarder (``engaged``), the
    forwarder applies the newest checkpoint itself, and an older one applied after it would
    make the store store again, and release again, what the newer one covers: none is applied
    here, and what had not settled is forgotten."""
    if forwarder.engaged:
        settling.clear()
        return
    for version, checkpoint in settling.settled():
        dropped = store.apply_checkpoint(checkpoint)
        if dropped:
            log.debug("replica.covered_entries_dropped", count=dropped, version=version)


def _rivals(election: Election) -> int | None:
    """How many other candidates stand, or None when ZooKeeper does not say."""
    try:
        return election.rivals()
    except CoordinationError as exc:
        log.warning("replica.election_unreadable", error=str(exc))
        return None
