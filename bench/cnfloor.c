/* cnfloor: the floor for reading process exits. It subscribes to the proc connector with
 * the kernel's exit-only filter (Linux >= 6.6) and does nothing per event but count it.
 * On SIGTERM or SIGINT it prints "events N enobufs M" and exits. */
#include <errno.h>
#include <linux/cn_proc.h>
#include <linux/connector.h>
#include <linux/netlink.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

int main(void)
{
	struct {
		struct nlmsghdr nl;
		struct cn_msg cn;
		__u32 op, filter; /* struct proc_input: op, then the event type wanted */
	} __attribute__((packed)) sub = {0};
	struct sockaddr_nl addr = {.nl_family = AF_NETLINK, .nl_groups = CN_IDX_PROC};
	struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: recv must return */
	unsigned long events = 0, enobufs = 0;
	int rcvbuf = 16 << 20, fd;
	char buf[16384];

	fd = socket(AF_NETLINK, SOCK_DGRAM, NETLINK_CONNECTOR);
	if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		perror("proc connector");
		return 1;
	}
	/* The same buffer the agent asks for, so both lose events under the same load. */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
	sub.nl.nlmsg_len = sizeof(sub);
	sub.nl.nlmsg_type = NLMSG_DONE;
	sub.cn.id.idx = CN_IDX_PROC;
	sub.cn.id.val = CN_VAL_PROC;
	sub.cn.len = 2 * sizeof(__u32);
	sub.op = PROC_CN_MCAST_LISTEN;
	sub.filter = PROC_EVENT_EXIT;
	if (send(fd, &sub, sizeof(sub), 0) < 0) {
		perror("subscribe");
		return 1;
	}
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	while (!stop) {
		/* One event per datagram: counting datagrams counts events. */
		if (recv(fd, buf, sizeof(buf), 0) > 0)
			events++;
		else if (errno == ENOBUFS)
			enobufs++;
	}
	printf("events %lu enobufs %lu\n", events, enobufs);
	return 0;
}
