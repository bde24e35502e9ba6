"""Host-local-compatible IP address management for SR-IOV attachments.

Used in-process by the ``sriov`` plugin (``sriov_cni.ipam.main.HANDLERS``) and as the
stand-alone CNI IPAM executable ``sriov-ipam``.  Reservations live in the
same files host-local uses, so either tool can take over the other's pool.
"""
