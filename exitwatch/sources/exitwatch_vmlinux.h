/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The few kernel types exitwatch.bpf.c reads, so the build needs neither the build
 * machine's kernel BTF nor its uapi headers. preserve_access_index makes every field
 * access a CO-RE relocation: libbpf fixes the offsets against the running kernel's BTF
 * at load time, so only the field names (not their layout here) must match the kernel.
 */
#ifndef EXITWATCH_VMLINUX_H
#define EXITWATCH_VMLINUX_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
/* bpf_helper_defs.h names these in helper prototypes. */
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_RINGBUF = 27,
};

typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	atomic_t live;
	int group_exit_code;
	unsigned int flags;
} __attribute__((preserve_access_index));

struct task_struct {
	int exit_code;
	int pid;
	int tgid;
	struct task_struct *group_leader;
	__u64 start_boottime;
	struct signal_struct *signal;
} __attribute__((preserve_access_index));

#endif
