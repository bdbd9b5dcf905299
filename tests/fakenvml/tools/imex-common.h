/*
 * What the stand-in nvidia-imex and nvidia-imex-ctl share (docs/standin-driver.md): the IMEX
 * config file (KEY=VALUE lines, '#' comments), the nodes config (one node address a line),
 * addresses, and the command service's protocol.
 *
 * Command protocol (private to these two programs): the client connects to the daemon's
 * command service, sends "STATUS\n" and reads until the daemon closes:
 *
 *   IMEX-STATUS 1
 *   state READY|WAITING_FOR_PEERS
 *   version <driver version>
 *   node <index> <address> <C|N|R> [self]     one line per node of its nodes config
 *   end
 *
 * C: connected, N: never connected, R: the connection was lost (the real tool's
 * "Recovering": clean-up not triggered, as with the default grace time of -1).
 */
#ifndef STANDIN_IMEX_COMMON_H
#define STANDIN_IMEX_COMMON_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "common.h"

#define IMEX_DEFAULT_CONFIG "/etc/nvidia-imex/config.cfg"
#define IMEX_DEFAULT_NODES "/etc/nvidia-imex/nodes_config.cfg"
#define IMEX_DEFAULT_LOG "/var/log/nvidia-imex.log"
#define IMEX_DEFAULT_SERVER_PORT 50000
#define IMEX_DEFAULT_CMD_PORT 50005
#define IMEX_MAX_NODES 128
#define IMEX_ADDR_MAX 256
#define IMEX_PATH_MAX 4096
#define IMEX_UNIX_MAX ((int)sizeof(((struct sockaddr_un *)0)->sun_path))

#define IMEX_STATE_READY "READY"
#define IMEX_STATE_WAITING "WAITING_FOR_PEERS"
#define IMEX_STATE_UNAVAILABLE "UNAVAILABLE"

struct imex_config {
    int server_port;                     /* SERVER_PORT */
    char bind_ip[64];                    /* BIND_INTERFACE_IP ("": from the nodes config) */
    char nodes_file[IMEX_PATH_MAX];      /* IMEX_NODE_CONFIG_FILE */
    int cmd_enabled;                     /* IMEX_CMD_ENABLED */
    int cmd_port;                        /* IMEX_CMD_PORT (0: none) */
    char cmd_bind_ip[64];                /* IMEX_CMD_BIND_INTERFACE_IP ("": all addresses) */
    char cmd_unix_path[IMEX_PATH_MAX];   /* IMEX_CMD_UNIX_DOMAIN_PATH ("": none) */
    char log_file[IMEX_PATH_MAX];        /* LOG_FILE_NAME ("": stderr) */
    int log_append;                      /* LOG_APPEND_TO_LOG */
    int daemonize;                       /* DAEMONIZE */
};

static inline char *imex_trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

static inline int imex_parse_port(const char *value, int allow_empty, int *out) {
    if (!*value && allow_empty) {
        *out = 0;
        return 0;
    }
    char *end;
    errno = 0;
    long port = strtol(value, &end, 10);
    if (!*value || *end || errno || port < 1 || port > 65535)
        return -1;
    *out = (int)port;
    return 0;
}

static inline int imex_parse_bool(const char *value, int *out) {
    if (strcmp(value, "0") == 0 || strcmp(value, "1") == 0) {
        *out = value[0] == '1';
        return 0;
    }
    return -1;
}

static inline int imex_parse_ipv4(const char *value, char *out, size_t cap) {
    struct in_addr addr;
    if (*value && inet_pton(AF_INET, value, &addr) != 1)
        return -1;
    return snprintf(out, cap, "%s", value) < (int)cap ? 0 : -1;
}

static inline int imex_copy(const char *value, char *out, size_t cap) {
    return snprintf(out, cap, "%s", value) < (int)cap ? 0 : -1;
}

/* Read the IMEX config file at `path` into `c` (defaults for what it does not set). Unknown
 * keys are ignored, as the real daemon's full config has many this one does not use. 0, or
 * -1 with the reason in `err`. */
static inline int imex_read_config(const char *path, struct imex_config *c, char *err,
                                   size_t cap) {
    memset(c, 0, sizeof *c);
    c->server_port = IMEX_DEFAULT_SERVER_PORT;
    c->cmd_port = IMEX_DEFAULT_CMD_PORT;
    c->log_append = 1;
    c->daemonize = 1;
    snprintf(c->nodes_file, sizeof c->nodes_file, "%s", IMEX_DEFAULT_NODES);
    snprintf(c->log_file, sizeof c->log_file, "%s", IMEX_DEFAULT_LOG);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, cap, "cannot read config file %.300s: %s", path, strerror(errno));
        return -1;
    }
    char raw[8192];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(raw, sizeof raw, f)) {
        lineno++;
        char *line = imex_trim(raw);
        if (!*line || *line == '#')
            continue;
        char *eq = strchr(line, '=');
        char *key_end = line;
        while (isalnum((unsigned char)*key_end) || *key_end == '_')
            key_end++;
        if (!eq || key_end == line || imex_trim(key_end) != eq) {
            snprintf(err, cap, "%.300s:%d: expected KEY=VALUE, got '%.200s'", path, lineno, line);
            rc = -1;
            break;
        }
        *key_end = '\0';
        *eq = '\0';
        const char *key = line, *value = imex_trim(eq + 1);
        int bad = 0;
        if (strcmp(key, "SERVER_PORT") == 0)
            bad = imex_parse_port(value, 0, &c->server_port);
        else if (strcmp(key, "BIND_INTERFACE_IP") == 0)
            bad = imex_parse_ipv4(value, c->bind_ip, sizeof c->bind_ip);
        else if (strcmp(key, "IMEX_NODE_CONFIG_FILE") == 0)
            bad = !*value || imex_copy(value, c->nodes_file, sizeof c->nodes_file);
        else if (strcmp(key, "IMEX_CMD_ENABLED") == 0)
            bad = imex_parse_bool(value, &c->cmd_enabled);
        else if (strcmp(key, "IMEX_CMD_PORT") == 0)
            bad = imex_parse_port(value, 1, &c->cmd_port);
        else if (strcmp(key, "IMEX_CMD_BIND_INTERFACE_IP") == 0)
            bad = imex_parse_ipv4(value, c->cmd_bind_ip, sizeof c->cmd_bind_ip);
        else if (strcmp(key, "IMEX_CMD_UNIX_DOMAIN_PATH") == 0)
            bad = (int)strlen(value) >= IMEX_UNIX_MAX ||
                  imex_copy(value, c->cmd_unix_path, sizeof c->cmd_unix_path);
        else if (strcmp(key, "LOG_FILE_NAME") == 0)
            bad = imex_copy(value, c->log_file, sizeof c->log_file);
        else if (strcmp(key, "LOG_APPEND_TO_LOG") == 0)
            bad = imex_parse_bool(value, &c->log_append);
        else if (strcmp(key, "DAEMONIZE") == 0)
            bad = imex_parse_bool(value, &c->daemonize);
        if (bad) {
            snprintf(err, cap, "%.300s:%d: invalid value for %.64s: '%.200s'", path, lineno, key,
                     value);
            rc = -1;
        }
    }
    fclose(f);
    return rc;
}

/* Read the nodes config: one address (IPv4 or host name) a line, blank lines and '#'
 * comments ignored. The number of nodes, or -1 with the reason in `err`. */
static inline int imex_read_nodes(const char *path, char nodes[][IMEX_ADDR_MAX], char *err,
                                  size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, cap, "cannot read nodes config file %.300s: %s", path, strerror(errno));
        return -1;
    }
    char raw[1024];
    int lineno = 0, n = 0;
    while (fgets(raw, sizeof raw, f)) {
        lineno++;
        char *line = imex_trim(raw);
        if (!*line || *line == '#')
            continue;
        int ok = strlen(line) < IMEX_ADDR_MAX;
        for (const char *p = line; ok && *p; p++)
            ok = isalnum((unsigned char)*p) || *p == '.' || *p == '-' || *p == '_';
        if (!ok) {
            snprintf(err, cap, "%.300s:%d: not a node address: '%.200s'", path, lineno, line);
            fclose(f);
            return -1;
        }
        if (n == IMEX_MAX_NODES) {
            snprintf(err, cap, "%.300s: more than %d nodes", path, IMEX_MAX_NODES);
            fclose(f);
            return -1;
        }
        snprintf(nodes[n++], IMEX_ADDR_MAX, "%.255s", line);
    }
    fclose(f);
    return n;
}

/* `host` (an IPv4 address, else a name to resolve) and `port` as a socket address. */
static inline int imex_resolve(const char *host, int port, struct sockaddr_in *out) {
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, host, &out->sin_addr) == 1)
        return 0;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return -1;
    out->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return 0;
}

static inline double imex_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
