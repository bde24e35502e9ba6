"""sriov-cni: SR-IOV virtual functions for Kubernetes pods."""

__version__ = "0.1.0"
