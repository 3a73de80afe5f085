/* The extended verbs as a C program compiled against the installed <infiniband/verbs.h> uses
 * them: every call below that is a header inline (ibv_query_port, ibv_query_device_ex,
 * ibv_create_cq_ex, ibv_create_qp_ex, ibv_wr_*, ibv_start_poll, ibv_post_recv, ...) dispatches
 * through the function pointers libsoftverbs-ibverbs filled in. Two devices in one process
 * (SOFTVERBS_UDP_ADDRS with two addresses), one RC QP each, connected; WRITE, SEND with
 * immediate and inline data, fetch-and-add through the ibv_qp_ex builder, completions through
 * ibv_cq_ex. Prints "ok" and exits 0 on success. */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s failed\n", __LINE__, #c); exit(1); } } while (0)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

struct node {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	char buf[4096] __attribute__((aligned(64)));
	union ibv_gid gid;
};

static void setup(struct node *n, struct ibv_device *dev)
{
	struct ibv_port_attr port;
	struct ibv_device_attr_ex dattr;
	struct ibv_gid_entry entry;

	n->ctx = ibv_open_device(dev);
	CHECK(n->ctx);
	CHECK(ibv_query_port(n->ctx, 1, &port) == 0);
	CHECK(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET);
	CHECK(ibv_query_device_ex(n->ctx, NULL, &dattr) == 0 && dattr.orig_attr.phys_port_cnt == 1);
	CHECK(ibv_query_gid_ex(n->ctx, 1, 0, &entry, 0) == 0 && entry.gid_type == IBV_GID_TYPE_ROCE_V2);
	CHECK(ibv_query_gid(n->ctx, 1, 0, &n->gid) == 0);
	n->pd = ibv_alloc_pd(n->ctx);
	CHECK(n->pd);
	n->mr = ibv_reg_mr(n->pd, n->buf, sizeof(n->buf), ACCESS);
	CHECK(n->mr);

	struct ibv_cq_init_attr_ex cattr = { .cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS };
	n->cq = ibv_create_cq_ex(n->ctx, &cattr);
	CHECK(n->cq);
	struct ibv_qp_init_attr_ex qattr = {
		.send_cq = ibv_cq_ex_to_cq(n->cq), .recv_cq = ibv_cq_ex_to_cq(n->cq),
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = n->pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
	};
	n->qp = ibv_create_qp_ex(n->ctx, &qattr);
	CHECK(n->qp);
	n->qpx = ibv_qp_to_qp_ex(n->qp);
	CHECK(n->qpx);
}

static void connect_to(struct node *n, struct node *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ACCESS };
	CHECK(ibv_modify_qp(n->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	CHECK(ibv_modify_qp(n->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(n->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* Polls `want` completions through ibv_cq_ex into ids/opcodes. */
static void poll_ex(struct ibv_cq_ex *cq, int want, uint64_t *ids, int *ops, uint32_t *imm)
{
	struct ibv_poll_cq_attr attr = {};
	int got = 0;
	time_t start = time(NULL);
	while (got < want) {
		CHECK(time(NULL) - start < 10);
		int r = ibv_start_poll(cq, &attr);
		if (r == ENOENT)
			continue;
		CHECK(r == 0);
		do {
			CHECK(cq->status == IBV_WC_SUCCESS);
			ids[got] = cq->wr_id;
			ops[got] = ibv_wc_read_opcode(cq);
			if (imm && (ibv_wc_read_wc_flags(cq) & IBV_WC_WITH_IMM))
				*imm = ntohl(ibv_wc_read_imm_data(cq));
			got++;
		} while (got < want && (r = ibv_next_poll(cq)) == 0);
		ibv_end_poll(cq);
	}
}

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num == 2);
	CHECK(strcmp(ibv_get_device_name(list[0]), "softverbs0") == 0);
	struct node *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	setup(a, list[0]);
	setup(b, list[1]);
	ibv_free_device_list(list);
	connect_to(a, b);
	connect_to(b, a);

	struct ibv_sge rsge = { (uintptr_t)b->buf + 1024, 64, b->mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 77, .sg_list = &rsge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(b->qp, &rwr, &bad) == 0);

	strcpy(a->buf, "written");
	uint64_t *counter = (uint64_t *)(b->buf + 2048);
	*counter = 40;
	ibv_wr_start(a->qpx);
	a->qpx->wr_id = 1;
	a->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(a->qpx, b->mr->rkey, (uintptr_t)b->buf);
	ibv_wr_set_sge(a->qpx, a->mr->lkey, (uintptr_t)a->buf, 8);
	a->qpx->wr_id = 2;
	ibv_wr_send_imm(a->qpx, htonl(0xabcd));
	ibv_wr_set_inline_data(a->qpx, "inline", 6);
	a->qpx->wr_id = 3;
	ibv_wr_atomic_fetch_add(a->qpx, b->mr->rkey, (uintptr_t)counter, 2);
	ibv_wr_set_sge(a->qpx, a->mr->lkey, (uintptr_t)a->buf + 512, 8);
	CHECK(ibv_wr_complete(a->qpx) == 0);

	uint64_t ids[3];
	int ops[3];
	poll_ex(a->cq, 3, ids, ops, NULL);
	CHECK(ids[0] == 1 && ops[0] == IBV_WC_RDMA_WRITE);
	CHECK(ids[1] == 2 && ops[1] == IBV_WC_SEND);
	CHECK(ids[2] == 3 && ops[2] == IBV_WC_FETCH_ADD);
	uint32_t imm = 0;
	poll_ex(b->cq, 1, ids, ops, &imm);
	CHECK(ids[0] == 77 && ops[0] == IBV_WC_RECV && imm == 0xabcd);
	CHECK(strcmp(b->buf, "written") == 0);
	CHECK(memcmp(b->buf + 1024, "inline", 6) == 0);
	CHECK(*counter == 42 && *(uint64_t *)(a->buf + 512) == 40);

	struct node *ns[2] = { a, b };
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_destroy_qp(ns[i]->qp) == 0);
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(ns[i]->cq)) == 0);
		CHECK(ibv_dereg_mr(ns[i]->mr) == 0);
		CHECK(ibv_dealloc_pd(ns[i]->pd) == 0);
		CHECK(ibv_close_device(ns[i]->ctx) == 0);
	}
	printf("ok\n");
	return 0;
}
