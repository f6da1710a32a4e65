/* common/stop_signal.c — see stop_signal.h. */
#define _GNU_SOURCE
#include "stop_signal.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t g_caught = 0;

static void on_stop_signal(int sig) {
    if (!g_caught) g_caught = sig;
}

void stop_signal_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* interrupted reads, writes and waits carry on */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGUSR1);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
}

int stop_signal_caught(void) { return (int)g_caught; }

int stop_signal_agree(Comm* c) { return comm_allreduce_host_max_int(c, (int)g_caught); }

void stop_signal_exit(Comm* c, int sig, int steps, const char* checkpoint) {
    const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
    int status = checkpoint ? STOP_EXIT_RESUME : 128 + sig;
    if (c->rank == 0) {
        if (checkpoint)
            printf("stopped by %s after step %d: checkpoint %s holds it; the same command with --resume "
                   "continues (exit %d)\n",
                   name, steps, checkpoint, status);
        else
            printf("stopped by %s after step %d: no checkpoint written (--checkpoint_on_signal not given; "
                   "exit %d)\n",
                   name, steps, status);
        fflush(stdout);
    }
    comm_barrier(c);
    comm_finalize(c);
    exit(status);
}
