"""rtnetlink's announcements the daemon's healing waits on, from the host's own kernel (veths and namespaces)."""

from __future__ import annotations

import select
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from sriov_cni.kernel.linkevents import LinkEvents

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
