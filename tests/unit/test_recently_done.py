"""The store's memory of recently delivered records: two generations of digests."""

from __future__ import annotations

from kdelay.delay_service.store.ids import RecentlyDone, id_key


def test_a_key_is_remembered_for_at_least_half_the_ttl_and_at_most_the_ttl() -> None:
    done = RecentlyDone(ttl_s=100.0, cap=1_000)
    done.add("order-1", "uid-1", now=0.0)
    assert id_key("order-1", "uid-1") in done
    assert id_key("order-1", "uid-2") not in done
    done.add("other", "u", now=49.0)
    assert id_key("order-1", "uid-1") in done
    done.add("other", "v", now=60.0)  # rotation: order-1 now in the previous generation
    assert id_key("order-1", "uid-1") in done
    done.add("other", "w", now=110.0)  # second rotation: forgotten
    assert id_key("order-1", "uid-1") not in done
    assert id_key("other", "w") in done


def test_a_long_pause_forgets_both_generations() -> None:
    done = RecentlyDone(ttl_s=100.0, cap=1_000)
    done.add("a", "1", now=0.0)
    done.add("b", "2", now=500.0)
    assert id_key("a", "1") not in done
    assert id_key("b", "2") in done


def test_the_cap_rotates_early_and_bounds_the_count() -> None:
    done = RecentlyDone(ttl_s=1e9, cap=100)
    for n in range(1_000):
        done.add("id", str(n), now=float(n))
    assert len(done) <= 100
    assert id_key("id", "999") in done
    assert id_key("id", "0") not in done


def test_records_without_a_buffer_key_are_not_remembered() -> None:
    done = RecentlyDone()
    done.add("legacy", "", now=0.0)
    assert len(done) == 0
    assert "not bytes" not in done
