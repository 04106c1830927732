/* forkloop SECONDS: fork children that exit at once, as fast as one core allows, for
 * SECONDS; then print how many exited. One per core drives the host's exit rate to its
 * maximum for the exit-storm benchmark. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double end;
	unsigned long exits = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: forkloop SECONDS\n");
		return 2;
	}
	end = now() + atof(argv[1]);
	/* Checking the clock every 64 forks keeps its cost out of the loop. */
	while ((exits & 63) || now() < end) {
		pid_t pid = fork();

		if (pid < 0) {
			perror("fork");
			return 1;
		}
		if (pid == 0)
			_exit(0);
		if (waitpid(pid, NULL, 0) == pid)
			exits++;
	}
	printf("%lu\n", exits);
	return 0;
}
