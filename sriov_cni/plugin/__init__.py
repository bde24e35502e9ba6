"""The ``sriov`` CNI plugin: its commands, its config, and the VF store it keeps.

:mod:`commands` runs ADD, DEL, CHECK, GC and STATUS; a VF is chosen
(:mod:`allocate`), held (:mod:`lease`), recorded (:mod:`store`), moved into
the pod and back (:mod:`bind`), tuned (:mod:`tuning`), and given addresses
by the IPAM plugin (:mod:`delegate`).  Node setup and status read the store
to say who holds a VF.
"""
