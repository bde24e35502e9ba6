"""The daemon's limits when ``sriov-cni daemon`` is not given the option for one.

A module of their own, importing nothing: the command line shows them in
its options, and importing :mod:`server` for them would load the whole
daemon (pyroute2, prometheus_client) into every ``sriov-cni`` run, the
readiness probe's every 20 s among them.
"""

# Seconds a caller has to send its request, and then to end its stdin: one
# that sends nothing (or half a request) must not hold a connection slot,
# nor a child, forever.
REQUEST_TIMEOUT = 10.0
# Each child is a forked copy of the daemon; calls beyond this wait in the
# daemon until one ends, so a flood cannot exhaust the node's memory.
# The daemon's memory budget lowers it further (budget.admission).
MAX_CHILDREN = 64
# A child serves calls one after another, up to this many (--calls-per-child):
# the first call in a forked child copies every page it writes (about a
# thousand per ADD, a tenth of a millisecond each on a slow node), the next
# ones find them copied.  Bounded, so what one call might leave behind
# cannot pile up; 1 gives every call a fresh child.
CALLS_PER_CHILD = 100
# Seconds a child that has served calls waits for another before it ends,
# giving back its copied pages (a burst of calls leaves as many children);
# the daemon forks fresh spares as needed.
CHILD_IDLE = 60.0
# Seconds a stopping daemon (SIGTERM) waits for the calls it runs to end
# (--drain-timeout); the DaemonSet's terminationGracePeriodSeconds is above.
DRAIN_TIMEOUT = 20.0
