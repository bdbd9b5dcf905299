/*
 * Stand-in nvidia-imex-ctl (docs/standin-driver.md): queries stand-in nvidia-imex daemons
 * through their command service.
 *
 *   nvidia-imex-ctl [-c CONFIG | -i IP PORT | -u SOCKET] -q
 *       this node's daemon state on stdout: READY, or WAITING_FOR_PEERS; exit 0. The daemon
 *       is found from CONFIG (default /etc/nvidia-imex/config.cfg): IMEX_CMD_UNIX_DOMAIN_PATH
 *       when set, else IMEX_CMD_BIND_INTERFACE_IP (127.0.0.1 when empty) and IMEX_CMD_PORT.
 *       No daemon answering: the reason on stderr, exit 1.
 *   nvidia-imex-ctl [-c CONFIG] -N [-j]
 *       the whole domain: every node of CONFIG's nodes config is asked at its address and
 *       IMEX_CMD_PORT; its state and version, the connectivity table (row: from, column: to)
 *       and the domain state (UP: every node READY and every connection up; DOWN: no node
 *       answered; else DEGRADED). -j: the same as JSON.
 *
 * Options may also be written --u=PATH, -c=PATH and so on.
 */
#include "imex-common.h"

#define ANSWER_TIMEOUT_MS 3000
#define CONNECT_TIMEOUT_MS 2000

struct node_status {
    char addr[IMEX_ADDR_MAX];
    char code[4];
    int self;
};

struct status {
    char state[32];
    char version[64];
    int n;
    struct node_status nodes[IMEX_MAX_NODES];
};

static void usage(FILE *to) {
    fprintf(to,
            "Usage: nvidia-imex-ctl [-i <IP> <PORT>|-u <unix domain socket path>|-c <config path>] "
            "<-q|-N> [-j]\n"
            "  -c <config path>  nvidia-imex config file (default " IMEX_DEFAULT_CONFIG ")\n"
            "  -i <IP> <PORT>    the command service at IP:PORT\n"
            "  -u <path>         the command service's unix domain socket\n"
            "  -q                query this node's IMEX daemon state once and return\n"
            "  -N                the status of the whole IMEX domain (needs the config file)\n"
            "  -j                -N as JSON\n");
}

static int wait_for(int fd, short events, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = events};
    int r;
    do
        r = poll(&p, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        errno = ETIMEDOUT;
    return r > 0 ? 0 : -1;
}

/* Ask the command service at `sa` for the daemon's status. 0, or -1 with errno set. */
static int query(const struct sockaddr *sa, socklen_t salen, struct status *out) {
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, sa, salen) != 0) {
        if (errno != EINPROGRESS || wait_for(fd, POLLOUT, CONNECT_TIMEOUT_MS) != 0)
            goto fail;
        int soerr = 0;
        socklen_t len = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        if (soerr) {
            errno = soerr;
            goto fail;
        }
    }
    if (send(fd, "STATUS\n", 7, MSG_NOSIGNAL) != 7)
        goto fail;
    static char answer[IMEX_MAX_NODES * (IMEX_ADDR_MAX + 32) + 256];
    size_t len = 0;
    for (;;) {
        if (wait_for(fd, POLLIN, ANSWER_TIMEOUT_MS) != 0)
            goto fail;
        ssize_t got = recv(fd, answer + len, sizeof answer - 1 - len, 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (got < 0)
            goto fail;
        if (got == 0 || (len += (size_t)got) == sizeof answer - 1)
            break;
    }
    close(fd);
    answer[len] = '\0';
    memset(out, 0, sizeof *out);
    int ended = 0;
    for (char *save = NULL, *line = strtok_r(answer, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        struct node_status *node = &out->nodes[out->n];
        char self[8] = "";
        int index;
        if (sscanf(line, "state %31s", out->state) == 1 ||
            sscanf(line, "version %63s", out->version) == 1)
            continue;
        if (out->n < IMEX_MAX_NODES &&
            sscanf(line, "node %d %255s %3s %7s", &index, node->addr, node->code, self) >= 3) {
            node->self = strcmp(self, "self") == 0;
            out->n++;
        } else if (strcmp(line, "end") == 0) {
            ended = 1;
        }
    }
    if (!ended || !out->state[0]) {
        errno = EPROTO;
        return -1;
    }
    return 0;
fail:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

static void print_timestamp(char *out, size_t cap) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    snprintf(out, cap, "%d/%d/%d %02d:%02d:%02d.%03ld", tm.tm_mon + 1, tm.tm_mday,
             tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L);
}

static const char *code_name(const char *code) {
    switch (code[0]) {
    case 'C':
        return "CONNECTED";
    case 'N':
        return "NEVER_CONNECTED";
    case 'R':
        return "RECOVERING";
    case '!':
        return "NODE_MAP_MISMATCH";
    default:
        return "INVALID";
    }
}

/* -N: ask every node of the nodes config. */
static int domain_status(const char *config_path, const struct imex_config *cfg, int json) {
    static char addrs[IMEX_MAX_NODES][IMEX_ADDR_MAX];
    static struct status st[IMEX_MAX_NODES];
    static char cells[IMEX_MAX_NODES][IMEX_MAX_NODES][4];
    int reached[IMEX_MAX_NODES];
    char err[1024];
    if (!cfg->cmd_enabled || !cfg->cmd_port) {
        fprintf(stderr, "nvidia-imex-ctl: no command service port in %s "
                        "(IMEX_CMD_ENABLED=1 and IMEX_CMD_PORT are needed for -N)\n",
                config_path);
        return 1;
    }
    int n = imex_read_nodes(cfg->nodes_file, addrs, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "nvidia-imex-ctl: %s\n", err);
        return 1;
    }
    int ready = 0, answered = 0, all_connected = 1;
    for (int i = 0; i < n; i++) {
        struct sockaddr_in sa;
        reached[i] = imex_resolve(addrs[i], cfg->cmd_port, &sa) == 0 &&
                     query((struct sockaddr *)&sa, sizeof sa, &st[i]) == 0;
        answered += reached[i];
        ready += reached[i] && strcmp(st[i].state, IMEX_STATE_READY) == 0;
        for (int j = 0; j < n; j++) {
            const char *code = "I";
            if (reached[i]) {
                code = "!M!";
                for (int k = 0; k < st[i].n; k++)
                    if (strcmp(st[i].nodes[k].addr, addrs[j]) == 0)
                        code = st[i].nodes[k].code;
            }
            snprintf(cells[i][j], sizeof cells[i][j], "%s", code);
            all_connected &= strcmp(code, "C") == 0;
        }
    }
    const char *domain = answered == 0                      ? "DOWN"
                         : ready == n && all_connected ? "UP"
                                                            : "DEGRADED";
    char stamp[64];
    print_timestamp(stamp, sizeof stamp);
    if (json) {
        printf("{\"nodes\": {");
        for (int i = 0; i < n; i++) {
            printf("%s\"%d\": {\"status\": \"%s\", \"host\": \"%s\", \"hostName\": \"N/A\", "
                   "\"version\": \"%s\", \"connections\": {",
                   i ? ", " : "", i, reached[i] ? st[i].state : IMEX_STATE_UNAVAILABLE, addrs[i],
                   reached[i] ? st[i].version : "N/A");
            for (int j = 0; j < n; j++)
                printf("%s\"%d\": {\"host\": \"%s\", \"status\": \"%s\", \"changed\": false}",
                       j ? ", " : "", j, addrs[j], code_name(cells[i][j]));
            printf("}}");
        }
        printf("}, \"timestamp\": \"%s\", \"status\": \"%s\"}\n", stamp, domain);
        return 0;
    }
    printf("Connectivity Table Legend:\n"
           "I - Invalid - the node did not answer: no connection status\n"
           "N - Never Connected\n"
           "R - Recovering - the connection was lost; clean up not triggered yet\n"
           "D - Disconnected - the connection was lost and clean up was triggered\n"
           "A - Authenticating - (not used by the stand-in)\n"
           "!V! - Version mismatch, communication disabled\n"
           "!M! - Node map mismatch, communication disabled\n"
           "C - Connected - ready for operation\n"
           "\n%s\nNodes:\n",
           stamp);
    for (int i = 0; i < n; i++)
        printf("Node #%-3d - %-15s - %-20s - Version: %s\n", i, addrs[i],
               reached[i] ? st[i].state : IMEX_STATE_UNAVAILABLE,
               reached[i] ? st[i].version : "N/A");
    printf("\n Nodes From\\To ");
    for (int j = 0; j < n; j++)
        printf(j + 1 < n ? " %-3d" : " %d", j);
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("%8d       ", i);
        for (int j = 0; j < n; j++)
            printf(j + 1 < n ? " %-3s" : " %s", cells[i][j]);
        printf("\n");
    }
    printf("\nDomain State: %s\n", domain);
    return 0;
}

/* Split "--opt=value" / "-opt=value" into the option ("-opt") and its value. */
static const char *option(const char *arg, char *name, size_t cap) {
    if (arg[0] == '-' && arg[1] == '-' && arg[2])
        arg++;
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    snprintf(name, cap, "%.*s", (int)(n < cap ? n : cap - 1), arg);
    return eq ? eq + 1 : NULL;
}

int main(int argc, char **argv) {
    const char *config_path = NULL, *unix_path = NULL, *ip = NULL, *port_text = NULL;
    int want_q = 0, want_n = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *value = option(argv[i], name, sizeof name);
#define VALUE() (value ? value : i + 1 < argc ? argv[++i] : NULL)
        if (strcmp(name, "-c") == 0) {
            config_path = VALUE();
        } else if (strcmp(name, "-u") == 0) {
            unix_path = VALUE();
        } else if (strcmp(name, "-i") == 0) {
            ip = VALUE();
            port_text = i + 1 < argc ? argv[++i] : NULL;
            if (!port_text)
                ip = NULL;
        } else if (strcmp(name, "-q") == 0) {
            want_q = 1;
        } else if (strcmp(name, "-N") == 0) {
            want_n = 1;
        } else if (strcmp(name, "-j") == 0) {
            json = 1;
        } else if (strcmp(name, "-h") == 0 || strcmp(name, "-help") == 0) {
            usage(stdout);
            return 0;
        } else if (strlen(name) == 2 && strchr("nsdmHt", name[1])) {
            fprintf(stderr, "nvidia-imex-ctl: %s is not implemented by the stand-in\n", name);
            return 1;
        } else {
            fprintf(stderr, "nvidia-imex-ctl: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 1;
        }
        if ((strcmp(name, "-c") == 0 && !config_path) || (strcmp(name, "-u") == 0 && !unix_path) ||
            (strcmp(name, "-i") == 0 && !ip)) {
            fprintf(stderr, "nvidia-imex-ctl: %s needs a value\n", name);
            usage(stderr);
            return 1;
        }
#undef VALUE
    }
    if ((config_path != NULL) + (unix_path != NULL) + (ip != NULL) > 1) {
        fprintf(stderr, "nvidia-imex-ctl: only one of -i, -u and -c can be given\n");
        return 1;
    }
    if (want_q + want_n != 1) {
        fprintf(stderr, "nvidia-imex-ctl: give one of -q and -N\n");
        usage(stderr);
        return 1;
    }
    if (want_n && (unix_path || ip)) {
        fprintf(stderr, "nvidia-imex-ctl: -N needs the config file (-c), not -i or -u\n");
        return 1;
    }

    struct imex_config cfg;
    char err[1024];
    if (!unix_path && !ip) {
        if (!config_path)
            config_path = IMEX_DEFAULT_CONFIG;
        if (imex_read_config(config_path, &cfg, err, sizeof err) != 0) {
            fprintf(stderr, "nvidia-imex-ctl: %s\n", err);
            return 1;
        }
        if (want_n)
            return domain_status(config_path, &cfg, json);
        if (!cfg.cmd_enabled) {
            fprintf(stderr, "nvidia-imex-ctl: the command service is not enabled "
                            "(IMEX_CMD_ENABLED=1) in %s\n",
                    config_path);
            return 1;
        }
        if (cfg.cmd_unix_path[0])
            unix_path = cfg.cmd_unix_path;
        else if (!cfg.cmd_port) {
            fprintf(stderr, "nvidia-imex-ctl: no IMEX_CMD_PORT or IMEX_CMD_UNIX_DOMAIN_PATH in %s\n",
                    config_path);
            return 1;
        }
    }

    struct sockaddr_storage ss;
    socklen_t sslen;
    char where[IMEX_PATH_MAX + 64];
    memset(&ss, 0, sizeof ss);
    if (unix_path) {
        struct sockaddr_un *su = (struct sockaddr_un *)&ss;
        if ((int)strlen(unix_path) >= IMEX_UNIX_MAX) {
            fprintf(stderr, "nvidia-imex-ctl: socket path too long: %s\n", unix_path);
            return 1;
        }
        su->sun_family = AF_UNIX;
        snprintf(su->sun_path, sizeof su->sun_path, "%.107s", unix_path);
        sslen = sizeof *su;
        snprintf(where, sizeof where, "%s", unix_path);
    } else {
        int port = cfg.cmd_port;
        const char *host = ip ? ip : cfg.cmd_bind_ip[0] ? cfg.cmd_bind_ip : "127.0.0.1";
        if (ip && imex_parse_port(port_text, 0, &port) != 0) {
            fprintf(stderr, "nvidia-imex-ctl: not a port: '%s'\n", port_text);
            return 1;
        }
        if (imex_resolve(host, port, (struct sockaddr_in *)&ss) != 0) {
            fprintf(stderr, "nvidia-imex-ctl: cannot resolve '%s'\n", host);
            return 1;
        }
        sslen = sizeof(struct sockaddr_in);
        snprintf(where, sizeof where, "%s:%d", host, port);
    }
    struct status st;
    if (query((struct sockaddr *)&ss, sslen, &st) != 0) {
        fprintf(stderr,
                "nvidia-imex-ctl: cannot get the status of the IMEX daemon through its command "
                "service at %s: %s\n",
                where, strerror(errno));
        return 1;
    }
    printf("%s\n", st.state);
    return 0;
}
