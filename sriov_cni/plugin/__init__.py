"""The ``sriov`` CNI plugin: its commands and its config.

:mod:`commands` runs ADD, DEL, CHECK, GC and STATUS; a VF is chosen from
the network's pool (:mod:`pool`, :mod:`allocate`), held (:mod:`lease`),
recorded in the VF store (:mod:`sriov_cni.vfstore`, which node setup and
status read to say who holds a VF), moved into the pod and back
(:mod:`attach`), tuned (:mod:`tuning`), and given addresses by the IPAM
plugin (:mod:`delegate`).
"""
