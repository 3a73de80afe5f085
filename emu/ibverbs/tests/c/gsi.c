/* softverbs_open_gsi as the rdma_cm drop-in finds it: dlsym(RTLD_DEFAULT, ...) in a program
 * linked with the built libibverbs.so.1. Two devices in one process (SOFTVERBS_UDP_ADDRS with
 * two addresses), each opens its GSI (UD QP 1 in RTS, Q_Key 0x80010000); a 256-byte MAD goes
 * from one QP1 to the other and arrives with source QPN 1 behind the 40-byte GRH; a second
 * open is EBUSY; ibv_destroy_qp closes it. Prints "ok" and exits 0 on success. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s failed (errno %d)\n", __LINE__, #c, errno); exit(1); } } while (0)

typedef struct ibv_qp *(*open_gsi_fn)(struct ibv_pd *, struct ibv_cq *, struct ibv_cq *,
				      uint32_t, uint32_t);

struct node {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[4096];
};

static void setup(struct node *n, struct ibv_device *dev, open_gsi_fn open_gsi)
{
	n->ctx = ibv_open_device(dev);
	CHECK(n->ctx);
	n->pd = ibv_alloc_pd(n->ctx);
	CHECK(n->pd);
	n->mr = ibv_reg_mr(n->pd, n->buf, sizeof(n->buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(n->mr);
	n->cq = ibv_create_cq(n->ctx, 16, NULL, NULL, 0);
	CHECK(n->cq);
	n->qp = open_gsi(n->pd, n->cq, n->cq, 8, 8);
	CHECK(n->qp);
	CHECK(n->qp->qp_num == 1 && n->qp->qp_type == IBV_QPT_UD && n->qp->state == IBV_QPS_RTS);
}

static struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 5;
	while (time(NULL) < end)
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
	fprintf(stderr, "no completion\n");
	exit(1);
}

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	static struct node a, b;
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	struct ibv_port_attr port;
	union ibv_gid gid;
	struct ibv_ah_attr ah_attr;
	struct ibv_ah *ah;
	struct ibv_sge sge;
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_send_wr swr, *bad_s;
	struct ibv_wc wc;
	int i;

	open_gsi_fn open_gsi = (open_gsi_fn)dlsym(RTLD_DEFAULT, "softverbs_open_gsi");
	CHECK(open_gsi);
	CHECK(list && num == 2);
	setup(&a, list[0], open_gsi);
	setup(&b, list[1], open_gsi);
	CHECK(ibv_query_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_QKEY, &init) == 0);
	CHECK(attr.qp_state == IBV_QPS_RTS && attr.qkey == 0x80010000u);
	CHECK(open_gsi(a.pd, a.cq, a.cq, 8, 8) == NULL && errno == EBUSY);
	CHECK(open_gsi(NULL, a.cq, a.cq, 8, 8) == NULL && errno == EINVAL);

	sge.addr = (uintptr_t)b.buf;
	sge.length = 40 + 256;
	sge.lkey = b.mr->lkey;
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 9;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	CHECK(ibv_post_recv(b.qp, &rwr, &bad_r) == 0);

	CHECK(ibv_query_port(b.ctx, 1, &port) == 0);
	CHECK(ibv_query_gid(b.ctx, 1, 0, &gid) == 0);
	memset(&ah_attr, 0, sizeof(ah_attr));
	ah_attr.is_global = 1;
	ah_attr.port_num = 1;
	ah_attr.grh.dgid = gid;
	ah_attr.grh.hop_limit = 64;
	ah = ibv_create_ah(a.pd, &ah_attr);
	CHECK(ah);
	for (i = 0; i < 256; i++)
		a.buf[i] = (char)(i * 7);
	sge.addr = (uintptr_t)a.buf;
	sge.length = 256;
	sge.lkey = a.mr->lkey;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 1;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.wr.ud.ah = ah;
	swr.wr.ud.remote_qpn = 1;
	swr.wr.ud.remote_qkey = 0x80010000u;
	CHECK(ibv_post_send(a.qp, &swr, &bad_s) == 0);
	wc = poll_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS);
	wc = poll_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 9 && wc.src_qp == 1 && wc.qp_num == 1);
	CHECK(wc.byte_len == 40 + 256 && (wc.wc_flags & IBV_WC_GRH));
	CHECK(memcmp(b.buf + 40, a.buf, 256) == 0);

	CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_destroy_qp(a.qp) == 0);
	a.qp = open_gsi(a.pd, a.cq, a.cq, 8, 8);
	CHECK(a.qp && a.qp->qp_num == 1);
	CHECK(ibv_destroy_qp(a.qp) == 0);
	CHECK(ibv_destroy_qp(b.qp) == 0);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
