// SPDX-License-Identifier: GPL-2.0-only
/*
 * sriov_rdma_stub: a TEST FIXTURE of sriov-cni's guest tests, never for a
 * real node.  tests/vm/rdmastub.py builds and loads it; the tests are in
 * tests/vm/test_rdma_stub.py.
 *
 * It stands in for the RDMA function of a VF on RoCE hardware (mlx5, irdma,
 * bnxt_re), which no emulated NIC has: each VF named at load time
 * (vfs=<PCI address>,...) gets an RDMA device whose parent is the VF's PCI
 * function (so sysfs lists it under <VF>/infiniband/), named like mlx5's
 * (mlx5_N), with one RoCE port (v1 and v2) bound to the VF's netdev, so the
 * RDMA core fills its GID table from the netdev's addresses.  Userspace can
 * open it (uverbsN), and it can change network namespace in exclusive mode.
 * Nothing that moves data works: queue pairs, completion queues and memory
 * registrations are refused with EOPNOTSUPP.
 *
 * A VF has its device while it is bound to a driver with a netdev (igbvf):
 * made at load or when the VF binds, removed when it unbinds (an unbind, a
 * sriov_numvfs reset, an rmmod of igbvf), and at unload.
 *
 * GPL-2.0 (not the project's Apache-2.0): the driver-core notifier symbols
 * it needs are exported to GPL modules only.
 */

#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/pci.h>
#include <net/addrconf.h>
#include <rdma/ib_addr.h>
#include <rdma/ib_mad.h>
#include <rdma/ib_verbs.h>

#define STUB_MAX_VFS 32
#define STUB_PORT 1
/* Room for the default GIDs and a few addresses, each as RoCE v1 and v2. */
#define STUB_GID_TABLE_LEN 32

static char *vfs[STUB_MAX_VFS];
static int nr_vfs;
module_param_array(vfs, charp, &nr_vfs, 0444);
MODULE_PARM_DESC(vfs, "PCI addresses of the VFs to give an RDMA device, e.g. 0000:01:10.0,0000:01:10.2");

struct stub_dev {
	struct ib_device ibdev; /* first: ib_alloc_device() requires it */
	struct pci_dev *pdev;
};

/* One per VF named at load; its device while it has one. */
struct stub_slot {
	const char *pci;
	struct stub_dev *sd;
};

static struct stub_slot slots[STUB_MAX_VFS];

/*
 * attach_lock serializes making and removing devices (load, a VF's bind
 * and unbind, unload).  slot_lock guards each slot's device for the netdev
 * notifier, which runs under RTNL.  Registering and unregistering an RDMA
 * device take RTNL (the GID cache walks the netdevs), so they run with
 * attach_lock held but never slot_lock: attach_lock -> RTNL -> slot_lock.
 */
static DEFINE_MUTEX(attach_lock);
static DEFINE_MUTEX(slot_lock);

static struct stub_dev *to_stub(struct ib_device *ibdev)
{
	return container_of(ibdev, struct stub_dev, ibdev);
}

static int stub_query_device(struct ib_device *ibdev, struct ib_device_attr *attr, struct ib_udata *udata)
{
	struct pci_dev *pdev = to_stub(ibdev)->pdev;

	attr->vendor_id = pdev->vendor;
	attr->vendor_part_id = pdev->device;
	attr->sys_image_guid = ibdev->node_guid;
	attr->max_pkeys = 1;
	return 0;
}

static int stub_query_port(struct ib_device *ibdev, u32 port, struct ib_port_attr *attr)
{
	struct net_device *ndev = ib_device_get_netdev(ibdev, port);

	attr->gid_tbl_len = STUB_GID_TABLE_LEN;
	attr->pkey_tbl_len = 1;
	attr->port_cap_flags = IB_PORT_CM_SUP;
	attr->max_mtu = IB_MTU_4096;
	attr->active_speed = IB_SPEED_SDR;
	attr->active_width = IB_WIDTH_1X;
	attr->state = IB_PORT_DOWN;
	attr->phys_state = IB_PORT_PHYS_STATE_DISABLED;
	attr->active_mtu = IB_MTU_256;
	/* No netdev while it moves between namespaces: the port is down then. */
	if (ndev) {
		attr->state = ib_get_curr_port_state(ndev);
		if (attr->state == IB_PORT_ACTIVE)
			attr->phys_state = IB_PORT_PHYS_STATE_LINK_UP;
		attr->active_mtu = iboe_get_mtu(ndev->mtu);
		dev_put(ndev);
	}
	return 0;
}

static int stub_get_port_immutable(struct ib_device *ibdev, u32 port, struct ib_port_immutable *immutable)
{
	/* mlx5's RoCE ports: v1 (Ethernet) and v2 (UDP) GIDs, MADs, the CM. */
	immutable->core_cap_flags = RDMA_CORE_PORT_IBA_ROCE | RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP;
	immutable->gid_tbl_len = STUB_GID_TABLE_LEN;
	immutable->pkey_tbl_len = 1;
	immutable->max_mad_size = IB_MGMT_MAD_SIZE;
	return 0;
}

static enum rdma_link_layer stub_get_link_layer(struct ib_device *ibdev, u32 port)
{
	return IB_LINK_LAYER_ETHERNET;
}

static int stub_query_pkey(struct ib_device *ibdev, u32 port, u16 index, u16 *pkey)
{
	if (index)
		return -EINVAL;
	*pkey = IB_DEFAULT_PKEY_FULL;
	return 0;
}

/*
 * A user context and a protection domain hold nothing here: opening the
 * device (uverbsN) and allocating a PD work, as they do on hardware.
 */
static int stub_alloc_ucontext(struct ib_ucontext *uctx, struct ib_udata *udata)
{
	return 0;
}

static void stub_dealloc_ucontext(struct ib_ucontext *uctx)
{
}

/*
 * With it, the core lets the device change network namespace (it resets
 * every open context on the way): there is no mapping to revoke.
 */
static void stub_disassociate_ucontext(struct ib_ucontext *uctx)
{
}

static int stub_alloc_pd(struct ib_pd *pd, struct ib_udata *udata)
{
	return 0;
}

static int stub_dealloc_pd(struct ib_pd *pd, struct ib_udata *udata)
{
	return 0;
}

/*
 * The data path: refused.  The core requires these of a kernel-verbs
 * provider (as mlx5 is); the ib_mad client's queue pair on port 1 then
 * fails to open, which the core logs and carries on from.
 */
static int stub_create_cq(struct ib_cq *cq, const struct ib_cq_init_attr *attr, struct uverbs_attr_bundle *attrs)
{
	return -EOPNOTSUPP;
}

static int stub_create_qp(struct ib_qp *qp, struct ib_qp_init_attr *init, struct ib_udata *udata)
{
	return -EOPNOTSUPP;
}

static int stub_modify_qp(struct ib_qp *qp, struct ib_qp_attr *attr, int mask, struct ib_udata *udata)
{
	return -EOPNOTSUPP;
}

static int stub_post_send(struct ib_qp *qp, const struct ib_send_wr *wr, const struct ib_send_wr **bad_wr)
{
	*bad_wr = wr;
	return -EOPNOTSUPP;
}

static int stub_post_recv(struct ib_qp *qp, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr)
{
	*bad_wr = wr;
	return -EOPNOTSUPP;
}

static int stub_poll_cq(struct ib_cq *cq, int num_entries, struct ib_wc *wc)
{
	return -EOPNOTSUPP;
}

static int stub_req_notify_cq(struct ib_cq *cq, enum ib_cq_notify_flags flags)
{
	return -EOPNOTSUPP;
}

static struct ib_mr *stub_get_dma_mr(struct ib_pd *pd, int access)
{
	return ERR_PTR(-EOPNOTSUPP);
}

static struct ib_mr *stub_reg_user_mr(struct ib_pd *pd, u64 start, u64 length, u64 virt, int access,
				      struct ib_dmah *dmah, struct ib_udata *udata)
{
	return ERR_PTR(-EOPNOTSUPP);
}

/* Required with their create verbs; never called, as nothing is created. */
static int stub_destroy_cq(struct ib_cq *cq, struct ib_udata *udata)
{
	return 0;
}

static int stub_destroy_qp(struct ib_qp *qp, struct ib_udata *udata)
{
	return 0;
}

static int stub_dereg_mr(struct ib_mr *mr, struct ib_udata *udata)
{
	return 0;
}

static const struct ib_device_ops stub_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = 1,

	.alloc_pd = stub_alloc_pd,
	.alloc_ucontext = stub_alloc_ucontext,
	.create_cq = stub_create_cq,
	.create_qp = stub_create_qp,
	.dealloc_pd = stub_dealloc_pd,
	.dealloc_ucontext = stub_dealloc_ucontext,
	.dereg_mr = stub_dereg_mr,
	.destroy_cq = stub_destroy_cq,
	.destroy_qp = stub_destroy_qp,
	.disassociate_ucontext = stub_disassociate_ucontext,
	.get_dma_mr = stub_get_dma_mr,
	.get_link_layer = stub_get_link_layer,
	.get_port_immutable = stub_get_port_immutable,
	.modify_qp = stub_modify_qp,
	.poll_cq = stub_poll_cq,
	.post_recv = stub_post_recv,
	.post_send = stub_post_send,
	.query_device = stub_query_device,
	.query_pkey = stub_query_pkey,
	.query_port = stub_query_port,
	.reg_user_mr = stub_reg_user_mr,
	.req_notify_cq = stub_req_notify_cq,

	/* The core allocates these objects, this size, before it calls the verb. */
	.size_ib_cq = sizeof(struct ib_cq),
	.size_ib_pd = sizeof(struct ib_pd),
	.size_ib_qp = sizeof(struct ib_qp),
	.size_ib_ucontext = sizeof(struct ib_ucontext),
};

static struct stub_slot *slot_of_name(const char *pci)
{
	int i;

	for (i = 0; i < nr_vfs; i++)
		if (!strcmp(slots[i].pci, pci))
			return &slots[i];
	return NULL;
}

/*
 * The VF's netdev, held, or NULL.  Looked for in every namespace: the
 * module may be loaded while a pod has the netdev.  The caller holds the
 * VF's device lock, so its driver cannot unregister the netdev meanwhile.
 */
static struct net_device *vf_netdev(struct pci_dev *pdev)
{
	struct net_device *ndev, *found = NULL;
	struct net *net;

	rcu_read_lock();
	for_each_net_rcu(net) {
		for_each_netdev_rcu(net, ndev) {
			if (ndev->dev.parent == &pdev->dev && ndev->reg_state == NETREG_REGISTERED) {
				found = ndev;
				dev_hold(found);
				goto out;
			}
		}
	}
out:
	rcu_read_unlock();
	return found;
}

/* Give the slot's VF its device; the caller holds the VF's device lock. */
static void stub_attach(struct stub_slot *slot, struct pci_dev *pdev)
{
	struct net_device *ndev;
	struct stub_dev *sd;
	int err;

	mutex_lock(&attach_lock);
	if (slot->sd)
		goto out;
	/* A VF on a driver without a netdev (vfio-pci) has no RDMA function either. */
	ndev = vf_netdev(pdev);
	if (!ndev)
		goto out;
	sd = ib_alloc_device(stub_dev, ibdev);
	if (!sd) {
		dev_put(ndev);
		goto out;
	}
	sd->pdev = pdev;
	sd->ibdev.dev.parent = &pdev->dev;
	sd->ibdev.node_type = RDMA_NODE_IB_CA;
	sd->ibdev.phys_port_cnt = 1;
	sd->ibdev.num_comp_vectors = 1;
	strscpy(sd->ibdev.node_desc, "sriov-cni RDMA stub", sizeof(sd->ibdev.node_desc));
	/* A GUID from the MAC, as rxe's: a VF given an admin MAC has one on mlx5 too. */
	addrconf_addr_eui48((u8 *)&sd->ibdev.node_guid, ndev->dev_addr);
	ib_set_device_ops(&sd->ibdev, &stub_ops);
	err = ib_device_set_netdev(&sd->ibdev, ndev, STUB_PORT);
	dev_put(ndev);
	if (!err)
		err = ib_register_device(&sd->ibdev, "mlx5_%d", &pdev->dev);
	if (err) {
		pci_err(pdev, "sriov_rdma_stub: no RDMA device: %d\n", err);
		ib_dealloc_device(&sd->ibdev);
		goto out;
	}
	/*
	 * Published only now, so the netdev notifier never sees a device
	 * half made.  A namespace move of the netdev in between would be
	 * missed; the tests move none while they load the module or bind a VF.
	 */
	mutex_lock(&slot_lock);
	slot->sd = sd;
	mutex_unlock(&slot_lock);
out:
	mutex_unlock(&attach_lock);
}

static void stub_detach(struct stub_slot *slot)
{
	struct stub_dev *sd;

	mutex_lock(&attach_lock);
	mutex_lock(&slot_lock);
	sd = slot->sd;
	slot->sd = NULL;
	mutex_unlock(&slot_lock);
	/* Wherever it is: unregistering takes it out of a pod's namespace too. */
	if (sd) {
		ib_unregister_device(&sd->ibdev);
		ib_dealloc_device(&sd->ibdev);
	}
	mutex_unlock(&attach_lock);
}

/*
 * Bind and unbind of a covered VF.  UNBIND_DRIVER comes before the driver's
 * remove: the device goes while the VF's netdev is still there, as on
 * hardware, where the RDMA function goes before the NIC's.
 */
static int stub_bus_event(struct notifier_block *nb, unsigned long action, void *data)
{
	struct device *dev = data;
	struct stub_slot *slot = slot_of_name(dev_name(dev));

	if (!slot)
		return NOTIFY_DONE;
	if (action == BUS_NOTIFY_BOUND_DRIVER)
		stub_attach(slot, to_pci_dev(dev));
	else if (action == BUS_NOTIFY_UNBIND_DRIVER)
		stub_detach(slot);
	return NOTIFY_DONE;
}

/*
 * A netdev that changes namespace is unregistered from the old one and
 * registered in the new one.  The port's netdev follows it, as mlx5_ib's
 * does, so the RDMA core fills the GID table from its addresses wherever
 * it is, and `rdma link` names it in its namespace.  Dropping it on
 * unregistration also means a netdev that goes never waits for this
 * module's reference.
 */
static int stub_netdev_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct net_device *ndev = netdev_notifier_info_to_dev(ptr);
	int i, err;

	if (event != NETDEV_REGISTER && event != NETDEV_UNREGISTER)
		return NOTIFY_DONE;
	mutex_lock(&slot_lock);
	for (i = 0; i < nr_vfs; i++) {
		struct stub_dev *sd = slots[i].sd;

		if (!sd || ndev->dev.parent != &sd->pdev->dev)
			continue;
		err = ib_device_set_netdev(&sd->ibdev, event == NETDEV_REGISTER ? ndev : NULL, STUB_PORT);
		if (err)
			pci_warn(sd->pdev, "sriov_rdma_stub: port netdev not updated: %d\n", err);
	}
	mutex_unlock(&slot_lock);
	return NOTIFY_DONE;
}

static struct notifier_block stub_bus_nb = { .notifier_call = stub_bus_event };
static struct notifier_block stub_netdev_nb = { .notifier_call = stub_netdev_event };

static int __init stub_init(void)
{
	int i, err;

	if (!nr_vfs) {
		pr_err("sriov_rdma_stub: no VFs given: vfs=<PCI address>,...\n");
		return -EINVAL;
	}
	for (i = 0; i < nr_vfs; i++)
		slots[i].pci = vfs[i];
	/* First, so no VF that binds meanwhile goes unseen. */
	err = bus_register_notifier(&pci_bus_type, &stub_bus_nb);
	if (err)
		return err;
	err = register_netdevice_notifier(&stub_netdev_nb);
	if (err) {
		bus_unregister_notifier(&pci_bus_type, &stub_bus_nb);
		return err;
	}
	/* A VF that does not exist yet gets its device when it is created and bound. */
	for (i = 0; i < nr_vfs; i++) {
		struct device *dev = bus_find_device_by_name(&pci_bus_type, NULL, slots[i].pci);

		if (!dev)
			continue;
		device_lock(dev);
		if (dev->driver)
			stub_attach(&slots[i], to_pci_dev(dev));
		device_unlock(dev);
		put_device(dev);
	}
	return 0;
}

static void __exit stub_exit(void)
{
	int i;

	/*
	 * Notifiers first, so no bind makes a device after the last is
	 * removed.  A VF unbound in between waits in its netdev's
	 * unregistration for this module's reference, until the loop below.
	 */
	unregister_netdevice_notifier(&stub_netdev_nb);
	bus_unregister_notifier(&pci_bus_type, &stub_bus_nb);
	for (i = 0; i < nr_vfs; i++)
		stub_detach(&slots[i]);
}

module_init(stub_init);
module_exit(stub_exit);
MODULE_DESCRIPTION("sriov-cni test fixture: an mlx5-like RoCE RDMA device on chosen VFs (no data path)");
MODULE_LICENSE("GPL");
