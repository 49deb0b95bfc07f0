"""The pre-login gate (proxy/auth/prelogin.py) and the cap on concurrent logins
(proxy/auth/login_gate.py), in process."""

from __future__ import annotations

import asyncio

import pytest

from kdelay.proxy.auth.login_gate import LoginGate, LoginsBusyError
from kdelay.proxy.auth.prelogin import PreloginGate, Refused, Ticket


def test_connections_are_capped_per_address_and_in_total() -> None:
    gate = PreloginGate(max_connections=3, max_per_address=2)
    a1, a2 = gate.admit("10.0.0.1"), gate.admit("10.0.0.1")
    assert isinstance(a1, Ticket)
    assert isinstance(a2, Ticket)
    assert gate.admit("10.0.0.1") == Refused("prelogin_max_connections_per_address", 2)
    b1 = gate.admit("10.0.0.2")
    assert isinstance(b1, Ticket)
    assert gate.admit("10.0.0.3") == Refused("prelogin_max_connections", 3)
    assert (gate.open, gate.refused) == (3, 2)
    a1.release()
    a1.release()  # idempotent: a connection that logged in and then closed
    assert gate.open == 2
    assert gate.from_address("10.0.0.1") == 1
    assert isinstance(gate.admit("10.0.0.3"), Ticket)


def test_an_address_that_left_leaves_nothing_behind() -> None:
    gate = PreloginGate(max_connections=10, max_per_address=10)
    tickets = [gate.admit(f"192.0.2.{i}") for i in range(10)]
    for ticket in tickets:
        assert isinstance(ticket, Ticket)
        ticket.release()
    assert gate.open == 0
    assert gate.addresses() == 0


@pytest.mark.parametrize(
    ("total", "per_address", "setting"),
    [(0, 1, "prelogin_max_connections"), (1, 0, "prelogin_max_connections_per_address")],
)
def test_a_cap_below_one_names_its_setting(total: int, per_address: int, setting: str) -> None:
    with pytest.raises(ValueError, match=setting):
        PreloginGate(total, per_address)


def test_logins_over_the_cap_wait_their_turn_in_order() -> None:
    async def run() -> None:
        gate = LoginGate(2)
        order: list[int] = []
        release = asyncio.Event()

        async def login(i: int) -> None:
            async with gate.slot(60):
                order.append(i)
                await release.wait()

        tasks = [asyncio.create_task(login(i)) for i in range(4)]
        for _ in range(5):  # let every task run until it holds a slot or waits for one
            await asyncio.sleep(0)
        assert (order, gate.running, gate.waiting) == ([0, 1], 2, 2)
        release.set()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]
        assert (gate.running, gate.waiting) == (0, 0)

    asyncio.run(run())


def test_a_login_that_finds_no_slot_before_its_deadline_fails_naming_the_setting() -> None:
    async def run() -> None:
        gate = LoginGate(1)
        held = asyncio.Event()
        done = asyncio.Event()

        async def holder() -> None:
            async with gate.slot(60):
                held.set()
                await done.wait()

        task = asyncio.create_task(holder())
        await held.wait()
        with pytest.raises(LoginsBusyError, match="max_concurrent_logins=1"):
            async with gate.slot(0.01):
                pytest.fail("no slot was free")
        assert gate.waiting == 0
        done.set()
        await task
        async with gate.slot(0):  # free again: taken at once
            assert gate.running == 1

    asyncio.run(run())
