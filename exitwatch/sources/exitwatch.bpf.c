// SPDX-License-Identifier: GPL-2.0
/*
 * Report the death of whole thread groups whose tgid is in `watched`, once each.
 *
 * Every exit on the host runs this, so the common case (an unwatched tgid) is one hash
 * lookup and nothing else; user space wakes only for the owners it asked about.
 */
#include "exitwatch_vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

/* include/linux/sched/signal.h; stable since 2.6. */
#define SIGNAL_GROUP_EXIT 0x00000004

char LICENSE[] SEC("license") = "GPL";

struct event {
	__u32 tgid;
	__u32 status;         /* raw wait status, as wait() on the group would see it */
	__u64 start_boottime; /* group leader's, in ns; user space turns it into ticks */
};

/* tgid -> start time (clock ticks) of the owner last watched at that tgid. Only the key
 * is used here; the value lets a person dumping the map (bpftool) see which owner a tgid
 * stands for. User space sets max_entries before load. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} watched SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} events SEC(".maps");

/* Deaths claimed but not reported because `events` was full. The map entry is already
 * gone by then, so user space must re-check every owner when this grows. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

SEC("raw_tp/sched_process_exit")
int exitwatch_exit(void *ctx)
{
	/* The exiting task is current; using it rather than the tracepoint's arguments keeps
	 * the program independent of that prototype, which kernels have extended. The tgid
	 * comes from a helper, so the common case reads no kernel memory at all. */
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct task_struct *task;
	struct event *e;
	__u32 zero = 0;
	__u64 *drops;
	unsigned int flags;

	if (!bpf_map_lookup_elem(&watched, &tgid))
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	/* do_exit() decrements live before this tracepoint, so 0 marks the group's last
	 * thread, which need not be the leader. */
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	/* Two threads can both see live == 0; only one delete succeeds. Deleting also keeps
	 * a later process that reuses the pid from matching. */
	if (bpf_map_delete_elem(&watched, &tgid) != 0)
		return 0;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		drops = bpf_map_lookup_elem(&lost, &zero);
		if (drops)
			__sync_fetch_and_add(drops, 1);
		return 0;
	}
	e->tgid = tgid;
	/* The same choice as wait_task_zombie(). */
	flags = BPF_CORE_READ(task, signal, flags);
	if (flags & SIGNAL_GROUP_EXIT)
		e->status = BPF_CORE_READ(task, signal, group_exit_code);
	else
		e->status = BPF_CORE_READ(task, group_leader, exit_code);
	e->start_boottime = BPF_CORE_READ(task, group_leader, start_boottime);
	bpf_ringbuf_submit(e, 0);
	return 0;
}
