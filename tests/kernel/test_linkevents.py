"""rtnetlink's announcements the daemon's healing waits on, from the host's own kernel (veths and namespaces)."""

from __future__ import annotations

import select
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pytest

from sriov_cni.kernel.libc import libc
from sriov_cni.kernel.linkevents import LinkEvents

CLONE_NEWNET = 0x40000000

# Seconds to wait for an announcement that the kernel sends at once; only
# a broken kernel or test fails to see it in that time.
BOUND = 30.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)


@pytest.fixture
def events() -> Iterator[LinkEvents]:
    listening = LinkEvents()
    try:
        yield listening
    finally:
        listening.close()


def _announced(events: LinkEvents) -> bool:
    """Whether an announcement that counts comes, each waited for up to BOUND seconds."""
    while select.select([events], [], [], BOUND)[0]:
        if events.drain():
            return True
    return False


def test_a_link_arriving_in_the_namespace_is_announced(events: LinkEvents) -> None:
    name = f"le{uuid.uuid4().hex[:6]}"
    ns = f"le-{name}"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", name, "type", "veth", "peer", "name", f"{name}p", "netns", ns)
        assert _announced(events)
        # Moved in from another namespace, as the kernel brings a dead pod's VF home.
        _ip("link", "set", name, "netns", ns)
        events.drain()
        _ip("-n", ns, "link", "set", name, "netns", "1")
        assert _announced(events)
    finally:
        _ip("netns", "del", ns)


def _listening_in(netns: str) -> LinkEvents:
    """A listener in namespace ``netns``: made by a thread that entered it (setns moves only the calling thread)."""
    made: list[LinkEvents] = []

    def enter_and_listen() -> None:
        with open(f"/var/run/netns/{netns}") as ns:
            assert libc().setns(ns.fileno(), CLONE_NEWNET) == 0
        made.append(LinkEvents())

    thread = threading.Thread(target=enter_and_listen)
    thread.start()
    thread.join()
    return made[0]


def test_a_links_changes_in_the_namespace_are_not_announced() -> None:
    """Real kernel: every ADD and DEL changes links in the host; only arrivals and namespace ends count.

    In a namespace of its own, where nothing else on the machine makes
    links.  The kernel queues its announcements on the socket within the
    call that made the change, so once ``ip`` has returned they are there.
    """
    name = f"le{uuid.uuid4().hex[:6]}"
    ns = f"le-{name}"
    _ip("netns", "add", ns)
    try:
        events = _listening_in(ns)
        try:
            _ip("-n", ns, "link", "add", name, "type", "veth", "peer", "name", f"{name}p")
            assert events.drain()
            _ip("-n", ns, "link", "set", name, "up")
            _ip("-n", ns, "link", "set", f"{name}p", "up")
            _ip("-n", ns, "link", "set", name, "down")
            _ip("-n", ns, "link", "set", name, "name", f"{name}r")
            assert select.select([events], [], [], 0)[0], "the changes were not announced to the socket at all"
            assert not events.drain()
        finally:
            events.close()
    finally:
        _ip("netns", "del", ns)


def test_a_namespace_that_ends_is_announced_once_the_host_knew_it(events: LinkEvents) -> None:
    name = f"le{uuid.uuid4().hex[:6]}"
    ns = f"le-{name}"
    _ip("netns", "add", ns)
    # Moving a link in gives the namespace an id in the host's.
    _ip("link", "add", name, "type", "veth", "peer", "name", f"{name}p", "netns", ns)
    _ip("link", "del", name)
    events.drain()
    _ip("netns", "del", ns)
    assert _announced(events)
