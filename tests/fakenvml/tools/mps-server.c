/*
 * Stand-in nvidia-cuda-mps-server (docs/standin-driver.md): the server process an MPS control
 * daemon starts. It serves no client; it logs its start to server.log in
 * $CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps) and waits for SIGTERM, SIGINT or
 * SIGHUP, then logs that and exits 0. The stand-in control daemon starts it with
 * PR_SET_PDEATHSIG, so it also ends when the daemon dies. Runs alone too.
 */
#include <signal.h>

#include "common.h"

static char g_log[4200];

static void server_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_line_v(g_log, "Server", 0, fmt, ap);
    va_end(ap);
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "usage: nvidia-cuda-mps-server (started by nvidia-cuda-mps-control)\n");
        return 1;
    }
    const char *log_dir = env_or("CUDA_MPS_LOG_DIRECTORY", DEFAULT_MPS_LOG_DIRECTORY);
    snprintf(g_log, sizeof g_log, "%s/server.log", log_dir);
    if (make_dirs(log_dir, 0755) != 0)
        fprintf(stderr, "nvidia-cuda-mps-server: cannot create %s: %s\n", log_dir,
                strerror(errno));

    sigset_t wanted;
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGTERM);
    sigaddset(&wanted, SIGINT);
    sigaddset(&wanted, SIGHUP);
    sigprocmask(SIG_BLOCK, &wanted, NULL);
    server_log("Startup (parent %d, driver %s)", (int)getppid(), STANDIN_DRIVER_VERSION);
    int signo = 0;
    while (sigwait(&wanted, &signo) != 0) {
    }
    server_log("Server shutting down on signal %d", signo);
    return 0;
}
