/*
 * Stand-in nvidia-imex (docs/standin-driver.md): the IMEX daemon of a multi-node NVLink
 * domain, as seen from outside: it reads the real config file, listens for its peers,
 * connects to every peer of its nodes config and reports READY through its command service
 * (nvidia-imex-ctl) once all of them are connected. No GPU memory is exported or imported.
 *
 *   nvidia-imex [-c CONFIG]     CONFIG default /etc/nvidia-imex/config.cfg
 *
 * Config keys used: SERVER_PORT, BIND_INTERFACE_IP, IMEX_NODE_CONFIG_FILE, IMEX_CMD_ENABLED,
 * IMEX_CMD_PORT, IMEX_CMD_BIND_INTERFACE_IP, IMEX_CMD_UNIX_DOMAIN_PATH, LOG_FILE_NAME,
 * LOG_APPEND_TO_LOG, DAEMONIZE; any other key is ignored. A line that is not KEY=VALUE, a bad
 * value, an unreadable nodes config or a port in use: the reason on stderr, exit 1.
 *
 * This node is the nodes config's address equal to BIND_INTERFACE_IP, or (when that is empty)
 * the first that is one of this machine's addresses. It listens on that address and
 * SERVER_PORT; every other node is a peer, which it connects to (from its own address) every
 * second until a connection is up. A connection counts once both sides have sent
 * "IMEX <version> <address>\n"; then each side sends "HB\n" every second, and a connection
 * silent for 3 s, closed or failed is lost. READY: every peer connected (a node alone is
 * READY at once); else WAITING_FOR_PEERS.
 *
 * Signals: SIGUSR1 re-reads the nodes config and restarts the outgoing connections (at most
 * once every 5 s, as the real daemon); SIGTERM, SIGINT and SIGQUIT exit 0; SIGHUP is logged.
 * One log line per event (peer connected, peer lost, ready, not ready, reload, exit) to
 * LOG_FILE_NAME, or stderr when that is empty or cannot be opened.
 */
#include "imex-common.h"

#include <ifaddrs.h>
#include <signal.h>
#include <stdarg.h>

#define HEARTBEAT_S 1.0
#define SILENCE_S 3.0
#define RETRY_S 1.0
#define CONNECT_TIMEOUT_S 2.0
#define RELOAD_WINDOW_S 5.0
#define MAX_INCOMING 512
#define MAX_CMD_CLIENTS 32
#define LINE_MAX_LEN 512

enum link_state { LINK_DOWN, LINK_CONNECTING, LINK_HELLO, LINK_UP };

struct link {
    int fd;
    enum link_state state;
    double since;     /* connect started, or last byte received */
    double last_sent;
    char buf[LINE_MAX_LEN];
    size_t len;
};

struct node {
    char addr[IMEX_ADDR_MAX];
    int self;
    int ever_up; /* connected once: a lost connection is "R", not "N" */
    double next_attempt;
    struct link out; /* our connection to it */
};

struct cmd_client {
    int fd;
    double since;
    char buf[256];
    size_t len;
};

static struct imex_config g_cfg;
static const char *g_config_path = IMEX_DEFAULT_CONFIG;
static struct node g_nodes[IMEX_MAX_NODES];
static int g_nnodes;
static struct in_addr g_self_addr;
static char g_self_text[64];
static int g_log_fd = STDERR_FILENO;
static int g_listen = -1, g_cmd_tcp = -1, g_cmd_unix = -1;
static struct link g_in[MAX_INCOMING];
static struct cmd_client g_cmd[MAX_CMD_CLIENTS];
static int g_ready = -1; /* last state logged */
static double g_last_reload = -1e9;
static volatile sig_atomic_t g_stop, g_reload, g_hup;

static void logf_(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void logf_(const char *level, const char *fmt, ...) {
    char line[2048];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    int n = (int)strftime(line, sizeof line, "[%b %d %Y %H:%M:%S] ", &tm);
    n += snprintf(line + n, sizeof line - (size_t)n, "[%s] [tid %d] ", level, (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    n += m < (int)(sizeof line - (size_t)n - 1) ? m : (int)(sizeof line - (size_t)n - 2);
    line[n++] = '\n';
    if (write(g_log_fd, line, (size_t)n) < 0) {
        /* a log that cannot be written is not worth dying for */
    }
}

#define LOG_INFO(...) logf_("INFO", __VA_ARGS__)
#define LOG_ERROR(...) logf_("ERROR", __VA_ARGS__)

static void on_signal(int sig) {
    if (sig == SIGUSR1)
        g_reload = 1;
    else if (sig == SIGHUP)
        g_hup = 1;
    else
        g_stop = sig;
}

static void close_link(struct link *l) {
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
    l->state = LINK_DOWN;
    l->len = 0;
}

static int send_line(int fd, const char *text) {
    size_t n = strlen(text);
    return send(fd, text, n, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)n ? 0 : -1;
}

static void send_hello(struct link *l, double now) {
    char hello[128];
    snprintf(hello, sizeof hello, "IMEX %s %s\n", STANDIN_DRIVER_VERSION, g_self_text);
    if (send_line(l->fd, hello) == 0)
        l->last_sent = now;
}

static int is_local_address(struct in_addr addr) {
    struct ifaddrs *list;
    if (getifaddrs(&list) != 0)
        return 0;
    int found = 0;
    for (struct ifaddrs *i = list; i && !found; i = i->ifa_next)
        found = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == addr.s_addr;
    freeifaddrs(list);
    return found;
}

/* Read the nodes config and find this node in it. 0, or -1 with the reason in `err` (the
 * previous nodes are then kept). Outgoing connections are restarted. */
static int load_nodes(char *err, size_t cap) {
    static char addrs[IMEX_MAX_NODES][IMEX_ADDR_MAX];
    int n = imex_read_nodes(g_cfg.nodes_file, addrs, err, cap);
    if (n < 0)
        return -1;
    struct in_addr resolved[IMEX_MAX_NODES];
    int known[IMEX_MAX_NODES];
    for (int i = 0; i < n; i++) {
        struct sockaddr_in sa;
        known[i] = imex_resolve(addrs[i], 0, &sa) == 0;
        resolved[i] = sa.sin_addr;
    }
    struct in_addr self;
    if (g_cfg.bind_ip[0]) {
        inet_pton(AF_INET, g_cfg.bind_ip, &self);
    } else {
        int found = -1;
        for (int i = 0; i < n && found < 0; i++)
            if (known[i] && is_local_address(resolved[i]))
                found = i;
        if (found < 0) {
            snprintf(err, cap,
                     "no address of this machine in the node configuration file %s "
                     "(and BIND_INTERFACE_IP is empty)",
                     g_cfg.nodes_file);
            return -1;
        }
        self = resolved[found];
    }
    for (int i = 0; i < g_nnodes; i++)
        close_link(&g_nodes[i].out);
    g_self_addr = self;
    inet_ntop(AF_INET, &self, g_self_text, sizeof g_self_text);
    g_nnodes = n;
    int self_found = 0;
    for (int i = 0; i < n; i++) {
        struct node *node = &g_nodes[i];
        memset(node, 0, sizeof *node);
        node->out.fd = -1;
        snprintf(node->addr, sizeof node->addr, "%s", addrs[i]);
        node->self = !self_found && known[i] && resolved[i].s_addr == self.s_addr;
        self_found |= node->self;
    }
    if (!self_found)
        LOG_ERROR("This node's address %s is not in the node configuration file %s",
                  g_self_text, g_cfg.nodes_file);
    for (int i = 0; i < n; i++)
        LOG_INFO("Node #%d: %s%s", i, g_nodes[i].addr, g_nodes[i].self ? " (this node)" : "");
    return 0;
}

static int listen_tcp(const char *ip, int port, char *err, size_t cap) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    if (ip && *ip)
        inet_pton(AF_INET, ip, &sa.sin_addr);
    else
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 64) != 0) {
        snprintf(err, cap, "cannot listen on %s:%d: %s", ip && *ip ? ip : "0.0.0.0", port,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static int listen_unix(const char *path, char *err, size_t cap) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%.107s", path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
        snprintf(err, cap, "cannot listen on %.300s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static int ready(void) {
    for (int i = 0; i < g_nnodes; i++)
        if (!g_nodes[i].self && g_nodes[i].out.state != LINK_UP)
            return 0;
    return 1;
}

static void report_state(void) {
    int now_ready = ready();
    if (now_ready == g_ready)
        return;
    g_ready = now_ready;
    if (now_ready) {
        LOG_INFO("IMEX daemon is READY: all %d peer(s) connected", g_nnodes > 0 ? g_nnodes - 1 : 0);
        return;
    }
    int waiting = 0;
    for (int i = 0; i < g_nnodes; i++)
        waiting += !g_nodes[i].self && g_nodes[i].out.state != LINK_UP;
    LOG_INFO("IMEX daemon is not ready: waiting for %d peer(s)", waiting);
}

static void peer_down(struct node *node, const char *why) {
    if (node->out.state == LINK_UP)
        LOG_ERROR("Connection to node %s lost: %s", node->addr, why);
    close_link(&node->out);
    node->next_attempt = imex_now() + RETRY_S;
}

static void start_connect(struct node *node, double now) {
    struct sockaddr_in peer;
    node->next_attempt = now + RETRY_S;
    if (imex_resolve(node->addr, g_cfg.server_port, &peer) != 0)
        return;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return;
    /* From this node's own address, as a peer on another machine would see it. */
    struct sockaddr_in local = {.sin_family = AF_INET, .sin_addr = g_self_addr};
    if (bind(fd, (struct sockaddr *)&local, sizeof local) != 0) {
        /* not fatal: the kernel picks the source address */
    }
    node->out.fd = fd;
    node->out.since = now;
    node->out.len = 0;
    if (connect(fd, (struct sockaddr *)&peer, sizeof peer) == 0) {
        node->out.state = LINK_HELLO;
        send_hello(&node->out, now);
    } else if (errno == EINPROGRESS) {
        node->out.state = LINK_CONNECTING;
    } else {
        close_link(&node->out);
    }
}

/* Read what a link has; complete lines go to on_line. -1 when the link is gone. */
static int read_link(struct link *l, double now, int (*on_line)(struct link *, const char *, void *),
                     void *ctx) {
    char chunk[512];
    ssize_t got = recv(l->fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (got == 0)
        return -1;
    if (got < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : -1;
    l->since = now;
    for (ssize_t i = 0; i < got; i++) {
        if (chunk[i] != '\n') {
            if (l->len + 1 >= sizeof l->buf)
                return -1; /* not our protocol */
            l->buf[l->len++] = chunk[i];
            continue;
        }
        l->buf[l->len] = '\0';
        l->len = 0;
        if (on_line(l, l->buf, ctx) != 0)
            return -1;
    }
    return 0;
}

static int valid_hello(const char *line, char *version, size_t cap) {
    char v[64], addr[64];
    if (sscanf(line, "IMEX %63s %63s", v, addr) != 2)
        return 0;
    snprintf(version, cap, "%s", v);
    return 1;
}

static int on_out_line(struct link *l, const char *line, void *ctx) {
    struct node *node = ctx;
    if (l->state == LINK_UP)
        return strcmp(line, "HB") == 0 ? 0 : -1;
    char version[64];
    if (!valid_hello(line, version, sizeof version))
        return -1;
    l->state = LINK_UP;
    node->ever_up = 1;
    LOG_INFO("Connection established to node %s (version %s)", node->addr, version);
    return 0;
}

static int on_in_line(struct link *l, const char *line, void *ctx) {
    (void)ctx;
    if (l->state == LINK_UP)
        return strcmp(line, "HB") == 0 ? 0 : -1;
    char version[64];
    if (!valid_hello(line, version, sizeof version))
        return -1;
    l->state = LINK_UP;
    send_hello(l, imex_now());
    return 0;
}

static void accept_peer(double now) {
    for (;;) {
        int fd = accept4(g_listen, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        struct link *slot = NULL;
        for (int i = 0; i < MAX_INCOMING && !slot; i++)
            if (g_in[i].fd < 0)
                slot = &g_in[i];
        if (!slot) {
            close(fd);
            continue;
        }
        slot->fd = fd;
        slot->state = LINK_HELLO;
        slot->since = now;
        slot->last_sent = now;
        slot->len = 0;
    }
}

static void accept_cmd(int listener, double now) {
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        struct cmd_client *slot = NULL;
        for (int i = 0; i < MAX_CMD_CLIENTS && !slot; i++)
            if (g_cmd[i].fd < 0)
                slot = &g_cmd[i];
        if (!slot) {
            close(fd);
            continue;
        }
        slot->fd = fd;
        slot->since = now;
        slot->len = 0;
    }
}

static void write_all(int fd, const char *text, size_t n) {
    /* The answer is small: wait for the socket rather than keep a write buffer. */
    while (n > 0) {
        ssize_t put = send(fd, text, n, MSG_NOSIGNAL);
        if (put < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, 1000) <= 0)
                return;
            continue;
        }
        if (put <= 0)
            return;
        text += put;
        n -= (size_t)put;
    }
}

static void answer_cmd(struct cmd_client *c) {
    static char reply[IMEX_MAX_NODES * (IMEX_ADDR_MAX + 32) + 256];
    size_t n = 0;
    if (strcmp(c->buf, "STATUS") != 0) {
        n = (size_t)snprintf(reply, sizeof reply, "ERROR unknown command\n");
    } else {
        n += (size_t)snprintf(reply + n, sizeof reply - n, "IMEX-STATUS 1\nstate %s\nversion %s\n",
                              ready() ? IMEX_STATE_READY : IMEX_STATE_WAITING,
                              STANDIN_DRIVER_VERSION);
        for (int i = 0; i < g_nnodes; i++) {
            const struct node *node = &g_nodes[i];
            char code = node->self || node->out.state == LINK_UP ? 'C' : node->ever_up ? 'R' : 'N';
            n += (size_t)snprintf(reply + n, sizeof reply - n, "node %d %s %c%s\n", i, node->addr,
                                  code, node->self ? " self" : "");
        }
        n += (size_t)snprintf(reply + n, sizeof reply - n, "end\n");
    }
    write_all(c->fd, reply, n < sizeof reply ? n : sizeof reply - 1);
    close(c->fd);
    c->fd = -1;
}

static void read_cmd(struct cmd_client *c) {
    char chunk[256];
    ssize_t got = recv(c->fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (got <= 0) {
        close(c->fd);
        c->fd = -1;
        return;
    }
    for (ssize_t i = 0; i < got; i++) {
        if (chunk[i] == '\n' || c->len + 1 >= sizeof c->buf) {
            c->buf[c->len] = '\0';
            answer_cmd(c);
            return;
        }
        c->buf[c->len++] = chunk[i];
    }
}

static void reload(double now) {
    if (now - g_last_reload < RELOAD_WINDOW_S) {
        LOG_INFO("SIGUSR1 ignored: the last one was less than %.0f s ago", RELOAD_WINDOW_S);
        return;
    }
    g_last_reload = now;
    LOG_INFO("SIGUSR1: re-reading %s and restarting the connections to the peers",
             g_cfg.nodes_file);
    char err[1024];
    if (load_nodes(err, sizeof err) != 0) {
        LOG_ERROR("%s; keeping the previous nodes", err);
        for (int i = 0; i < g_nnodes; i++)
            close_link(&g_nodes[i].out);
    }
    for (int i = 0; i < g_nnodes; i++)
        g_nodes[i].next_attempt = now;
}

static void open_log(void) {
    if (!g_cfg.log_file[0])
        return;
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (g_cfg.log_append ? O_APPEND : O_TRUNC);
    int fd = open(g_cfg.log_file, flags, 0644);
    if (fd < 0) {
        fprintf(stderr, "nvidia-imex: cannot open log file %s (%s): logging to stderr\n",
                g_cfg.log_file, strerror(errno));
        return;
    }
    g_log_fd = fd;
}

static void usage(FILE *to) {
    fprintf(to, "Usage: nvidia-imex [-c <config file>]\n"
                "  -c <config file>  IMEX config file (default " IMEX_DEFAULT_CONFIG ")\n"
                "  -h, --help        this help\n"
                "  -v, --version     the version\n");
}

/* Fork; the parent exits 0 (the listeners are already open, so the caller can connect). */
static void daemonize(void) {
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "nvidia-imex: fork: %s\n", strerror(errno));
        exit(1);
    }
    if (pid > 0)
        _exit(0);
    setsid();
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        if (g_log_fd != STDERR_FILENO)
            dup2(null, STDERR_FILENO);
        close(null);
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            g_config_path = argv[++i];
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--version") == 0) {
            printf("IMEX version is: %s\n", STANDIN_DRIVER_VERSION);
            return 0;
        } else {
            fprintf(stderr, "nvidia-imex: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 1;
        }
    }
    char err[1024];
    if (imex_read_config(g_config_path, &g_cfg, err, sizeof err) != 0) {
        fprintf(stderr, "nvidia-imex: %s\n", err);
        return 1;
    }
    open_log();
    {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        localtime_r(&ts.tv_sec, &tm);
        char head[128];
        int n = snprintf(head, sizeof head, "IMEX Log initializing at: %d/%d/%d %02d:%02d:%02d.%03ld\n",
                         tm.tm_mon + 1, tm.tm_mday, tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
                         tm.tm_sec, ts.tv_nsec / 1000000L);
        if (write(g_log_fd, head, (size_t)n) < 0) {
            /* as in logf_ */
        }
    }
    LOG_INFO("IMEX version %s (stand-in) is running with config file %s", STANDIN_DRIVER_VERSION,
             g_config_path);
    for (int i = 0; i < MAX_INCOMING; i++)
        g_in[i].fd = -1;
    for (int i = 0; i < MAX_CMD_CLIENTS; i++)
        g_cmd[i].fd = -1;
    if (load_nodes(err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        fprintf(stderr, "nvidia-imex: %s\n", err);
        return 1;
    }
    g_listen = listen_tcp(g_self_text, g_cfg.server_port, err, sizeof err);
    if (g_listen >= 0 && g_cfg.cmd_enabled && g_cfg.cmd_port)
        g_cmd_tcp = listen_tcp(g_cfg.cmd_bind_ip, g_cfg.cmd_port, err, sizeof err);
    if (g_listen >= 0 && g_cfg.cmd_enabled && g_cfg.cmd_port && g_cmd_tcp < 0)
        g_listen = -1;
    if (g_listen >= 0 && g_cfg.cmd_enabled && g_cfg.cmd_unix_path[0]) {
        g_cmd_unix = listen_unix(g_cfg.cmd_unix_path, err, sizeof err);
        if (g_cmd_unix < 0)
            g_listen = -1;
    }
    if (g_listen < 0) {
        LOG_ERROR("%s", err);
        fprintf(stderr, "nvidia-imex: %s\n", err);
        return 1;
    }
    LOG_INFO("Listening for peers on %s:%d", g_self_text, g_cfg.server_port);
    if (g_cmd_tcp >= 0)
        LOG_INFO("Command service listening on %s:%d",
                 g_cfg.cmd_bind_ip[0] ? g_cfg.cmd_bind_ip : "0.0.0.0", g_cfg.cmd_port);
    if (g_cmd_unix >= 0)
        LOG_INFO("Command service listening on %s", g_cfg.cmd_unix_path);
    if (g_cfg.daemonize)
        daemonize();

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    report_state();
    static struct pollfd fds[3 + IMEX_MAX_NODES + MAX_INCOMING + MAX_CMD_CLIENTS];
    while (!g_stop) {
        double now = imex_now();
        if (g_reload) {
            g_reload = 0;
            reload(now);
        }
        if (g_hup) {
            g_hup = 0;
            LOG_INFO("SIGHUP: nothing buffered to dump");
        }
        /* Connect, heartbeat, time out. */
        for (int i = 0; i < g_nnodes; i++) {
            struct node *node = &g_nodes[i];
            struct link *l = &node->out;
            if (node->self)
                continue;
            if (l->state == LINK_DOWN && now >= node->next_attempt)
                start_connect(node, now);
            if (l->state == LINK_CONNECTING || l->state == LINK_HELLO) {
                if (now - l->since > CONNECT_TIMEOUT_S)
                    peer_down(node, "timed out");
            } else if (l->state == LINK_UP) {
                if (now - l->since > SILENCE_S)
                    peer_down(node, "no heartbeat for 3 s");
                else if (now - l->last_sent >= HEARTBEAT_S && send_line(l->fd, "HB\n") == 0)
                    l->last_sent = now;
            }
        }
        for (int i = 0; i < MAX_INCOMING; i++) {
            struct link *l = &g_in[i];
            if (l->fd < 0)
                continue;
            if (now - l->since > SILENCE_S)
                close_link(l);
            else if (l->state == LINK_UP && now - l->last_sent >= HEARTBEAT_S &&
                     send_line(l->fd, "HB\n") == 0)
                l->last_sent = now;
        }
        for (int i = 0; i < MAX_CMD_CLIENTS; i++)
            if (g_cmd[i].fd >= 0 && now - g_cmd[i].since > 2.0) {
                close(g_cmd[i].fd);
                g_cmd[i].fd = -1;
            }
        report_state();

        /* Wait. */
        nfds_t nfds = 0;
        fds[nfds++] = (struct pollfd){.fd = g_listen, .events = POLLIN};
        fds[nfds++] = (struct pollfd){.fd = g_cmd_tcp, .events = POLLIN};
        fds[nfds++] = (struct pollfd){.fd = g_cmd_unix, .events = POLLIN};
        for (int i = 0; i < g_nnodes; i++) {
            struct link *l = &g_nodes[i].out;
            short ev = l->state == LINK_CONNECTING ? POLLOUT : POLLIN;
            fds[nfds++] = (struct pollfd){.fd = l->state == LINK_DOWN ? -1 : l->fd, .events = ev};
        }
        for (int i = 0; i < MAX_INCOMING; i++)
            fds[nfds++] = (struct pollfd){.fd = g_in[i].fd, .events = POLLIN};
        for (int i = 0; i < MAX_CMD_CLIENTS; i++)
            fds[nfds++] = (struct pollfd){.fd = g_cmd[i].fd, .events = POLLIN};
        if (poll(fds, nfds, 200) < 0) {
            if (errno == EINTR)
                continue;
            LOG_ERROR("poll: %s", strerror(errno));
            break;
        }
        now = imex_now();

        /* Handle. */
        nfds_t k = 0;
        if (fds[k++].revents)
            accept_peer(now);
        if (fds[k++].revents)
            accept_cmd(g_cmd_tcp, now);
        if (fds[k++].revents)
            accept_cmd(g_cmd_unix, now);
        for (int i = 0; i < g_nnodes; i++, k++) {
            struct node *node = &g_nodes[i];
            struct link *l = &node->out;
            if (!fds[k].revents || l->state == LINK_DOWN)
                continue;
            if (l->state == LINK_CONNECTING) {
                int soerr = 0;
                socklen_t len = sizeof soerr;
                getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
                if (soerr != 0) {
                    peer_down(node, strerror(soerr));
                    continue;
                }
                l->state = LINK_HELLO;
                l->since = now;
                send_hello(l, now);
                continue;
            }
            if (read_link(l, now, on_out_line, node) != 0)
                peer_down(node, "connection closed");
        }
        for (int i = 0; i < MAX_INCOMING; i++, k++)
            if (fds[k].revents && g_in[i].fd >= 0 && read_link(&g_in[i], now, on_in_line, NULL) != 0)
                close_link(&g_in[i]);
        for (int i = 0; i < MAX_CMD_CLIENTS; i++, k++)
            if (fds[k].revents && g_cmd[i].fd >= 0)
                read_cmd(&g_cmd[i]);
    }

    LOG_INFO("Received signal %d: shutting down", (int)g_stop);
    for (int i = 0; i < g_nnodes; i++)
        close_link(&g_nodes[i].out);
    for (int i = 0; i < MAX_INCOMING; i++)
        close_link(&g_in[i]);
    for (int i = 0; i < MAX_CMD_CLIENTS; i++)
        if (g_cmd[i].fd >= 0)
            close(g_cmd[i].fd);
    close(g_listen);
    if (g_cmd_tcp >= 0)
        close(g_cmd_tcp);
    if (g_cmd_unix >= 0) {
        close(g_cmd_unix);
        unlink(g_cfg.cmd_unix_path);
    }
    LOG_INFO("Exit");
    return 0;
}
