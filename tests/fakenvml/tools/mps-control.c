/*
 * Stand-in nvidia-cuda-mps-control (docs/standin-driver.md): the MPS control daemon and its
 * client, enough for the agent's MPS sharing to run as on a GPU node.
 *
 *   nvidia-cuda-mps-control -d    start the daemon: fork, setsid; the parent exits 0 once
 *                                 the daemon listens (1, with the reason, when it cannot)
 *   nvidia-cuda-mps-control -f    the daemon in the foreground (log lines also on stderr)
 *   nvidia-cuda-mps-control       client: one command a line from stdin, each sent to the
 *                                 daemon and its reply printed; exit 1 when no daemon
 *                                 listens ("Cannot find MPS control daemon process") or
 *                                 when the daemon refused a command (the reason on stderr)
 *
 * Environment: CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) holds the daemon's unix
 * socket `control` and its pid file `nvidia-cuda-mps-control.pid`; CUDA_MPS_LOG_DIRECTORY
 * (default /var/log/nvidia-mps) its `control.log` (one line per start, command, server and
 * exit) and the server's `server.log`. The daemon keeps its environment and argv, so
 * /proc/<pid>/environ and /proc/<pid>/cmdline show what it was started with.
 *
 * The daemon starts one nvidia-cuda-mps-server at once (the real one starts servers when
 * clients come): the binary of that name next to its own executable (/proc/self/exe), with
 * PR_SET_PDEATHSIG, so it dies with the daemon. Commands: quit (the server is stopped and
 * reaped, socket and pid file removed; then the client gets its answer and the daemon
 * exits), get/set_default_active_thread_percentage, get/set_default_device_pinned_mem_limit,
 * get_server_list. SIGTERM, SIGINT and SIGHUP quit the same way.
 *
 * Protocol (private to this program): a client connects once per command, sends the command
 * line and shuts down its writing side; the daemon answers "<status>\n<text>" (status 0: done,
 * 1: refused, text the reason) and closes. A connection that sends nothing is a probe.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "common.h"

#define SOCKET_NAME "control"
#define PID_FILE "nvidia-cuda-mps-control.pid"
#define SERVER_NAME "nvidia-cuda-mps-server"
#define NO_DAEMON "Cannot find MPS control daemon process"
#define MAX_DEVICES 64
#define LIMIT_TEXT 32
#define COMMAND_MAX 1024
#define REPLY_MAX 4096
/* How long the daemon waits for a client's command, and a client for the daemon's answer. */
#define CLIENT_TIMEOUT_S 2
#define ANSWER_TIMEOUT_S 20
/* How long quit waits for the server to exit after SIGTERM before SIGKILL. */
#define SERVER_GRACE_MS 2000

static char g_pipe_dir[PATH_MAX], g_log_dir[PATH_MAX];
static char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char g_pid_file[PATH_MAX + 64], g_log[PATH_MAX + 64];
static int g_echo;     /* -f: log lines also on stderr */
static int g_multi_user; /* -M: clients of any user */
static int g_listen = -1;
static pid_t g_server = -1;
static double g_thread_percentage = 100.0;
static char g_pinned[MAX_DEVICES][LIMIT_TEXT]; /* "" when not set */
static volatile sig_atomic_t g_stop_signal, g_child_exited;

static void control_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_line_v(g_log, "Control", g_echo, fmt, ap);
    va_end(ap);
}

static int usage(FILE *out, int status) {
    fprintf(out, "usage: nvidia-cuda-mps-control [-d | -f | -h] [-M]\n"
                 "  -d  start the MPS control daemon in the background\n"
                 "  -f  run the MPS control daemon in the foreground\n"
                 "  -M  multi-user: serve clients of any user\n"
                 "  -h  this help\n"
                 "Without options: read commands from stdin and send them to the daemon.\n"
                 "(stand-in for tests, driver %s)\n",
            STANDIN_DRIVER_VERSION);
    return status;
}

/* The directories and paths from the environment; -1 (said on stderr) when they do not fit. */
static int setup_paths(void) {
    const char *pipe_dir = env_or("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_MPS_PIPE_DIRECTORY);
    const char *log_dir = env_or("CUDA_MPS_LOG_DIRECTORY", DEFAULT_MPS_LOG_DIRECTORY);
    if (absolute_path(g_pipe_dir, sizeof g_pipe_dir, pipe_dir) != 0 ||
        absolute_path(g_log_dir, sizeof g_log_dir, log_dir) != 0) {
        fprintf(stderr, "nvidia-cuda-mps-control: directory path too long\n");
        return -1;
    }
    if (snprintf(g_socket, sizeof g_socket, "%s/%s", g_pipe_dir, SOCKET_NAME) >=
        (int)sizeof g_socket) {
        fprintf(stderr, "nvidia-cuda-mps-control: socket path %s/%s is longer than %zu bytes\n",
                g_pipe_dir, SOCKET_NAME, sizeof g_socket - 1);
        return -1;
    }
    snprintf(g_pid_file, sizeof g_pid_file, "%s/%s", g_pipe_dir, PID_FILE);
    snprintf(g_log, sizeof g_log, "%s/control.log", g_log_dir);
    return 0;
}

/* A connection to the daemon's socket, or -1. */
static int connect_daemon(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, g_socket, strlen(g_socket) + 1);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- the daemon ------------------------------------------------------------------------ */

static void on_signal(int signo) {
    if (signo == SIGCHLD)
        g_child_exited = 1;
    else
        g_stop_signal = signo;
}

static void start_server(void) {
    char self[PATH_MAX], server[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) {
        control_log("Cannot start the server: /proc/self/exe: %s", strerror(errno));
        return;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(server, sizeof server, "%s/%s", slash ? self : ".", SERVER_NAME);
    pid_t daemon_pid = getpid();
    /* Closed by the child's exec (close-on-exec): once read() sees it closed, the server
     * runs as nvidia-cuda-mps-server, so whoever sees the daemon also sees its server. */
    int exec_done[2];
    if (pipe2(exec_done, O_CLOEXEC) != 0) {
        control_log("Cannot start the server: pipe: %s", strerror(errno));
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        control_log("Cannot start the server: fork: %s", strerror(errno));
        close(exec_done[0]);
        close(exec_done[1]);
        return;
    }
    if (pid == 0) {
        /* The server dies with the daemon, however the daemon ends. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != daemon_pid)
            _exit(0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        char *args[] = {SERVER_NAME, NULL};
        execv(server, args);
        control_log("Cannot start the server %s: %s", server, strerror(errno));
        _exit(127);
    }
    close(exec_done[1]);
    char byte;
    while (read(exec_done[0], &byte, 1) < 0 && errno == EINTR)
        ;
    close(exec_done[0]);
    g_server = pid;
    control_log("Starting new server %d for user %u", (int)pid, (unsigned)getuid());
}

static void reap_children(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid != g_server)
            continue;
        if (WIFSIGNALED(status))
            control_log("Server %d exited on signal %d", (int)pid, WTERMSIG(status));
        else
            control_log("Server %d exited with status %d", (int)pid, WEXITSTATUS(status));
        g_server = -1;
    }
}

static void stop_server(void) {
    if (g_server <= 0)
        return;
    pid_t pid = g_server;
    kill(pid, SIGTERM);
    for (int waited = 0; g_server > 0 && waited < SERVER_GRACE_MS; waited += 10) {
        reap_children();
        if (g_server > 0) {
            struct timespec nap = {0, 10 * 1000000L};
            nanosleep(&nap, NULL);
        }
    }
    if (g_server > 0) {
        control_log("Server %d ignored SIGTERM: killing it", (int)pid);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        g_server = -1;
    }
}

/* Everything quit does before the daemon answers and exits. */
static void shut_down(void) {
    stop_server();
    unlink(g_socket);
    unlink(g_pid_file);
    if (g_listen >= 0)
        close(g_listen);
    g_listen = -1;
}

/* "10240M", "1G": digits and a unit M or G (either case). */
static int valid_limit(const char *text) {
    size_t digits = strspn(text, "0123456789");
    if (digits == 0 || digits > 12 || strlen(text) != digits + 1)
        return 0;
    return strchr("MmGg", text[digits]) != NULL;
}

/* A device ordinal 0..MAX_DEVICES-1, or -1. */
static int device_ordinal(const char *text) {
    char *end;
    if (!text || !*text || strspn(text, "0123456789") != strlen(text))
        return -1;
    long n = strtol(text, &end, 10);
    return n < MAX_DEVICES ? (int)n : -1;
}

/* Run one command: 0 with the answer in `reply`, or 1 with the reason; *quit when the
 * daemon must exit after answering. */
static int run_command(char *line, char *reply, size_t cap, int *quit) {
    char copy[COMMAND_MAX];
    snprintf(copy, sizeof copy, "%s", line);
    char *save = NULL, *words[4] = {0};
    int nwords = 0;
    for (char *w = strtok_r(copy, " \t", &save); w; w = strtok_r(NULL, " \t", &save))
        if (nwords < 4)
            words[nwords++] = w;
        else
            nwords++;
    const char *cmd = words[0];
    reply[0] = '\0';

    if (strcmp(cmd, "quit") == 0) { /* "quit -t <seconds>" is accepted and waits as quit */
        *quit = 1;
        return 0;
    }
    if (strcmp(cmd, "get_default_active_thread_percentage") == 0 && nwords == 1) {
        snprintf(reply, cap, "%.1f\n", g_thread_percentage);
        return 0;
    }
    if (strcmp(cmd, "set_default_active_thread_percentage") == 0) {
        char *end = NULL;
        double value = nwords == 2 ? strtod(words[1], &end) : -1;
        if (nwords != 2 || end == words[1] || *end || !(value >= 0.0 && value <= 100.0)) {
            snprintf(reply, cap, "Invalid active thread percentage \"%s\": expected a number "
                                 "from 0 to 100\n",
                     nwords >= 2 ? words[1] : "");
            return 1;
        }
        g_thread_percentage = value;
        snprintf(reply, cap, "%.1f\n", value);
        return 0;
    }
    if (strcmp(cmd, "set_default_device_pinned_mem_limit") == 0) {
        int dev = nwords == 3 ? device_ordinal(words[1]) : -1;
        if (dev < 0 || !valid_limit(words[2])) {
            snprintf(reply, cap, "Invalid arguments: expected set_default_device_pinned_mem_limit "
                                 "<device 0..%d> <limit, e.g. 10240M or 1G>\n",
                     MAX_DEVICES - 1);
            return 1;
        }
        snprintf(g_pinned[dev], LIMIT_TEXT, "%s", words[2]);
        size_t last = strlen(g_pinned[dev]) - 1;
        g_pinned[dev][last] = (char)(g_pinned[dev][last] == 'm' ? 'M'
                                     : g_pinned[dev][last] == 'g' ? 'G'
                                                                  : g_pinned[dev][last]);
        return 0;
    }
    if (strcmp(cmd, "get_default_device_pinned_mem_limit") == 0) {
        int dev = nwords == 2 ? device_ordinal(words[1]) : -1;
        if (dev < 0) {
            snprintf(reply, cap, "Invalid arguments: expected get_default_device_pinned_mem_limit "
                                 "<device 0..%d>\n",
                     MAX_DEVICES - 1);
            return 1;
        }
        snprintf(reply, cap, "%s\n", g_pinned[dev][0] ? g_pinned[dev] : "N/A");
        return 0;
    }
    if (strcmp(cmd, "get_server_list") == 0 && nwords == 1) {
        if (g_server > 0)
            snprintf(reply, cap, "%d\n", (int)g_server);
        return 0;
    }
    snprintf(reply, cap, "Unknown command or wrong arguments: %s\n", line);
    return 1;
}

/* One client connection: read its command, answer it. Returns 1 when the daemon must exit. */
static int serve_client(int fd) {
    struct timeval timeout = {CLIENT_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    char line[COMMAND_MAX];
    size_t len = 0;
    for (;;) {
        ssize_t n = recv(fd, line + len, sizeof line - 1 - len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (memchr(line, '\n', len) || len == sizeof line - 1)
            break;
    }
    line[len] = '\0';
    line[strcspn(line, "\r\n")] = '\0';
    char *command = line + strspn(line, " \t");
    for (size_t end = strlen(command); end > 0 && strchr(" \t", command[end - 1]); end--)
        command[end - 1] = '\0';
    if (!*command) { /* a probe, or a client that said nothing */
        close(fd);
        return 0;
    }
    char reply[REPLY_MAX], header[8];
    int quit = 0;
    int status = run_command(command, reply, sizeof reply, &quit);
    if (status == 0)
        control_log("%s", command);
    else
        control_log("%s: refused: %.*s", command, (int)strcspn(reply, "\n"), reply);
    if (quit) {
        shut_down();
        control_log("Exit");
    }
    snprintf(header, sizeof header, "%d\n", status);
    if (write_all(fd, header, strlen(header)) == 0)
        write_all(fd, reply, strlen(reply));
    close(fd);
    return quit;
}

static int write_pid_file(void) {
    char tmp[sizeof g_pid_file + 16], text[32];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_pid_file);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    int len = snprintf(text, sizeof text, "%d\n", (int)getpid());
    int ok = write(fd, text, (size_t)len) == len;
    if (close(fd) != 0 || !ok || rename(tmp, g_pid_file) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int run_daemon(int detach) {
    if (make_dirs(g_pipe_dir, 0755) != 0 || make_dirs(g_log_dir, 0755) != 0) {
        fprintf(stderr, "nvidia-cuda-mps-control: cannot create %s or %s: %s\n", g_pipe_dir,
                g_log_dir, strerror(errno));
        return 1;
    }
    int probe = connect_daemon();
    if (probe >= 0) {
        close(probe);
        fprintf(stderr, "An instance of this daemon is already running\n");
        return 1;
    }

    /* Signals arrive only while the loop waits in ppoll. */
    sigset_t handled, waiting;
    sigemptyset(&handled);
    sigaddset(&handled, SIGTERM);
    sigaddset(&handled, SIGINT);
    sigaddset(&handled, SIGHUP);
    sigaddset(&handled, SIGCHLD);
    sigprocmask(SIG_BLOCK, &handled, &waiting);
    sigdelset(&waiting, SIGTERM);
    sigdelset(&waiting, SIGINT);
    sigdelset(&waiting, SIGHUP);
    sigdelset(&waiting, SIGCHLD);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int ready[2] = {-1, -1};
    if (detach) {
        if (pipe2(ready, O_CLOEXEC) != 0) {
            fprintf(stderr, "nvidia-cuda-mps-control: pipe: %s\n", strerror(errno));
            return 1;
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "nvidia-cuda-mps-control: fork: %s\n", strerror(errno));
            return 1;
        }
        if (pid > 0) {
            /* Exit once the daemon listens; its error is on stderr when it could not. */
            close(ready[1]);
            char byte = 0;
            ssize_t n;
            while ((n = read(ready[0], &byte, 1)) < 0 && errno == EINTR) {
            }
            return n == 1 ? 0 : 1;
        }
        close(ready[0]);
        setsid();
    }

    g_listen = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, g_socket, strlen(g_socket) + 1);
    unlink(g_socket); /* a dead daemon's: nobody answered the probe */
    if (g_listen < 0 || bind(g_listen, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(g_listen, 16) != 0) {
        fprintf(stderr, "nvidia-cuda-mps-control: cannot listen on %s: %s\n", g_socket,
                strerror(errno));
        return 1;
    }
    if (write_pid_file() != 0) {
        fprintf(stderr, "nvidia-cuda-mps-control: cannot write %s: %s\n", g_pid_file,
                strerror(errno));
        unlink(g_socket);
        return 1;
    }
    control_log("Starting control daemon using socket %s", g_socket);
    if (g_multi_user)
        control_log("Multi-user mode: clients of any user are served");
    control_log("To connect CUDA applications to this daemon, set env "
                "CUDA_MPS_PIPE_DIRECTORY=%s",
                g_pipe_dir);
    control_log("Stand-in MPS control daemon, driver %s", STANDIN_DRIVER_VERSION);
    if (detach) {
        /* Let go of the caller's terminal and pipes: whoever waits for their end (a
         * subprocess reading the output) is not kept waiting by the daemon or its server. */
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, STDIN_FILENO);
            dup2(null, STDOUT_FILENO);
            dup2(null, STDERR_FILENO);
            if (null > STDERR_FILENO)
                close(null);
        }
        if (chdir("/") != 0) {
            /* the paths in use are absolute */
        }
    }
    start_server();
    if (detach) {
        if (write(ready[1], "R", 1) != 1) {
            /* the parent is gone: nobody to tell */
        }
        close(ready[1]);
    }

    for (;;) {
        if (g_child_exited) {
            g_child_exited = 0;
            reap_children();
        }
        if (g_stop_signal) {
            control_log("Received signal %d: quitting", (int)g_stop_signal);
            shut_down();
            control_log("Exit");
            return 0;
        }
        struct pollfd pfd = {.fd = g_listen, .events = POLLIN};
        int n = ppoll(&pfd, 1, NULL, &waiting);
        if (n < 0) {
            if (errno != EINTR) {
                control_log("poll: %s", strerror(errno));
                struct timespec nap = {0, 100 * 1000000L};
                nanosleep(&nap, NULL);
            }
            continue;
        }
        if (!(pfd.revents & POLLIN))
            continue;
        int client = accept4(g_listen, NULL, NULL, SOCK_CLOEXEC);
        if (client >= 0 && serve_client(client))
            return 0;
    }
}

/* ---- the client ------------------------------------------------------------------------ */

static int send_command(const char *command) {
    int fd = connect_daemon();
    if (fd < 0) {
        fprintf(stderr, "%s\n", NO_DAEMON);
        return -1;
    }
    struct timeval timeout = {ANSWER_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    char line[COMMAND_MAX + 2];
    snprintf(line, sizeof line, "%s\n", command);
    if (write_all(fd, line, strlen(line)) != 0) {
        close(fd);
        fprintf(stderr, "%s\n", NO_DAEMON);
        return -1;
    }
    shutdown(fd, SHUT_WR);
    char answer[REPLY_MAX + 16];
    size_t len = 0;
    for (;;) {
        ssize_t n = recv(fd, answer + len, sizeof answer - 1 - len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || (len += (size_t)n) == sizeof answer - 1)
            break;
    }
    close(fd);
    answer[len] = '\0';
    char *text = strchr(answer, '\n');
    if (!text || (answer[0] != '0' && answer[0] != '1')) {
        fprintf(stderr, "nvidia-cuda-mps-control: no answer from the daemon to \"%s\"\n",
                command);
        return -1;
    }
    text++;
    int refused = answer[0] == '1';
    fputs(text, refused ? stderr : stdout);
    fflush(NULL);
    return refused;
}

static int run_client(void) {
    int probe = connect_daemon();
    if (probe < 0) {
        fprintf(stderr, "%s\n", NO_DAEMON);
        return 1;
    }
    close(probe);
    char line[COMMAND_MAX];
    int status = 0;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *command = line + strspn(line, " \t");
        if (!*command)
            continue;
        int rc = send_command(command);
        if (rc < 0)
            return 1;
        if (rc > 0)
            status = 1;
    }
    return status;
}

int main(int argc, char **argv) {
    int daemon_mode = 0, foreground = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-d") == 0)
            daemon_mode = 1;
        else if (strcmp(argv[i], "-f") == 0)
            foreground = 1;
        else if (strcmp(argv[i], "-M") == 0)
            g_multi_user = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return usage(stdout, 0);
        else
            return usage(stderr, 1);
    }
    if (daemon_mode && foreground)
        return usage(stderr, 1);
    if (setup_paths() != 0)
        return 1;
    if (daemon_mode || foreground) {
        g_echo = foreground;
        return run_daemon(daemon_mode);
    }
    return run_client();
}
