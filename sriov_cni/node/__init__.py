"""The node command's work: ``sriov-cni setup`` and ``sriov-cni status``.

Reading the node config, creating VFs and binding their driver, choosing the
CPUs for a PF's queue IRQs, and reporting who holds which VF.  The command
line itself is :mod:`sriov_cni.cli`, which also starts the daemon.
"""
