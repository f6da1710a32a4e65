/* common/stop_signal.h — stopping a run cleanly on a signal.
 *
 * A batch system ends a job with SIGTERM, then SIGKILL after a grace time
 * (SLURM: at the time limit and on scancel, KillWait seconds apart, to
 * every process of the job). Once stop_signal_install() has run, SIGTERM
 * and SIGUSR1 (an early warning: sbatch --signal, forwarded by mpirun and
 * srun) no longer end the process: they only mark a stop as requested, on
 * whichever rank they reach, any number of times. stop_signal_agree(),
 * called by every rank at every step boundary, tells every rank alike
 * whether any rank has been signalled, so that they all stop after the same
 * step. The trainer then writes a checkpoint of that step if asked to and
 * calls stop_signal_exit().
 *
 * Exit statuses:
 *   STOP_EXIT_RESUME (75, EX_TEMPFAIL): stopped on a signal, and the
 *     newest complete checkpoint holds the last completed step: the same
 *     command with --resume continues exactly. A batch script may requeue
 *     the job on it (tools/slurm/train.sbatch does, unless the job was
 *     cancelled).
 *   128 + the signal (143 for SIGTERM, 138 for SIGUSR1): stopped on a
 *     signal, no checkpoint written: what the signal would have given.
 * A step in progress finishes first, so the grace time must cover one step
 * and one checkpoint; SIGKILL during the save leaves the previous complete
 * checkpoint intact (checkpoint/checkpoint.h).
 */
#ifndef COMMON_STOP_SIGNAL_H
#define COMMON_STOP_SIGNAL_H

#include "../comm/comm.h"

#define STOP_EXIT_RESUME 75

/* Catch SIGTERM and SIGUSR1 (and unblock them, should the launcher have
 * blocked them). Call once, early, on every rank. */
void stop_signal_install(void);
/* The signal this process has caught (the first one), 0 if none. */
int stop_signal_caught(void);
/* Collective over every rank: a signal some rank has caught (the largest
 * number), 0 when none has. Every rank gets the same answer. */
int stop_signal_agree(Comm* c);
/* Collective; ends the process on every rank. rank 0 prints why the run
 * stopped after `steps` completed steps and where it can continue from
 * (checkpoint: the directory of the checkpoint of that step, or NULL when
 * none was written); then every rank waits for the others (so that no
 * launcher tears a rank down while rank 0 finishes the save), finalizes
 * the communicator and exits with STOP_EXIT_RESUME (checkpoint) or
 * 128 + the signal. */
NORETURN void stop_signal_exit(Comm* c, int sig, int steps, const char* checkpoint);

#endif
