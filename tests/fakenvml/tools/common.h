/*
 * Helpers shared by the stand-in driver's tools (docs/standin-driver.md): log lines with
 * timestamps, directories, the MPS environment.
 */
#ifndef STANDIN_COMMON_H
#define STANDIN_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The driver version the tools were built for (tests/fakenvml/build.py sets it). */
#ifndef STANDIN_DRIVER_VERSION
#define STANDIN_DRIVER_VERSION "unknown"
#endif

#define DEFAULT_MPS_PIPE_DIRECTORY "/tmp/nvidia-mps"
#define DEFAULT_MPS_LOG_DIRECTORY "/var/log/nvidia-mps"

/* An environment variable's value, or `fallback` when it is unset or empty. */
static inline const char *env_or(const char *name, const char *fallback) {
    const char *value = getenv(name);
    return value && *value ? value : fallback;
}

/* `path` as an absolute path in `out` (relative paths are taken from the working
 * directory); -1 when it does not fit. */
static inline int absolute_path(char *out, size_t cap, const char *path) {
    if (path[0] == '/')
        return snprintf(out, cap, "%s", path) < (int)cap ? 0 : -1;
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        return -1;
    return snprintf(out, cap, "%s/%s", cwd, path) < (int)cap ? 0 : -1;
}

/* mkdir -p; 0 or -1 with errno set. */
static inline int make_dirs(const char *path, mode_t mode) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, mode) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(buf, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Append one line "[2025-11-26 14:20:01.123 <who> <pid>] <message>" to `path` with a single
 * write (lines of several processes never mix); also to stderr when `echo`. */
static inline void log_line_v(const char *path, const char *who, int echo, const char *fmt,
                              va_list ap) {
    char line[2048];
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    localtime_r(&now.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "[%04d-%02d-%02d %02d:%02d:%02d.%03ld %s %d] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, now.tv_nsec / 1000000L, who, (int)getpid());
    if (n < 0 || n >= (int)sizeof line - 2)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    if (m < 0)
        return;
    n += m < (int)(sizeof line - (size_t)n - 1) ? m : (int)(sizeof line - (size_t)n - 2);
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) < 0) {
            /* nothing to do: a log that cannot be written is not worth dying for */
        }
        close(fd);
    }
    if (echo && write(STDERR_FILENO, line, (size_t)n) < 0) {
        /* as above */
    }
}

#endif
