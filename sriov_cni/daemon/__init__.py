"""The sriov-cni daemon and the executables that call it.

:mod:`server` is ``sriov-cni daemon``: it runs the ``sriov`` and
``sriov-ipam`` CNI calls in warm forked children.  Its callers are the
static shim (shim/sriov-shim.c, built into this directory as
``sriov-shim`` by the package's build or ``make -C shim``, which ``sriov-cni install-cni``,
:mod:`install`, copies to the node) and the Python ``sriov`` executable,
:mod:`client`, which runs the call in process when no daemon of its
version answers.
"""
