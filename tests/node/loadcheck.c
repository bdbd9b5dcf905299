/*
 * Load NVIDIA driver libraries the way CUDA programs do, and report what the loader gave.
 *
 * tests/node/test_driver_files.py builds it twice on the host and runs it in a container of
 * the real node, with the container image's own dynamic loader and /etc/ld.so.cache:
 *
 *   dlopen-check SONAME:SYMBOL...  dlopen()s each soname by name, as the CUDA runtime
 *                                  opens libcuda.so.1 and NVML users libnvidia-ml.so.1
 *   linked-check                   built with -DLINKED against libcuda.so.1 and
 *                                  libnvidia-ml.so.1: the loader must resolve both
 *                                  (DT_NEEDED) before main, as for a program linked with -lcuda
 *
 * One line per library:
 *   LOADED <soname> path=<file the loader opened> real=<its real path> <symbol>=<result>
 *          version=<simulated_driver_version()>
 * or FAILED <soname> <reason>. Exit status 1 when any library failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int report(const char *soname, void *handle, const char *symbol)
{
    struct link_map *map = NULL;
    char real[PATH_MAX];
    int (*entry)(void);
    const char *(*version)(void);

    if (handle == NULL) {
        printf("FAILED %s %s\n", soname, dlerror());
        return 1;
    }
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL) {
        printf("FAILED %s dlinfo: %s\n", soname, dlerror());
        return 1;
    }
    *(void **)&entry = dlsym(handle, symbol);
    *(void **)&version = dlsym(handle, "simulated_driver_version");
    if (entry == NULL || version == NULL) {
        printf("FAILED %s %s: %s\n", soname, symbol, dlerror());
        return 1;
    }
    if (realpath(map->l_name, real) == NULL)
        strcpy(real, "?");
    printf("LOADED %s path=%s real=%s %s=%d version=%s\n", soname, map->l_name, real, symbol,
           entry(), version());
    return 0;
}

#ifdef LINKED
int cuInit(void);
int nvmlInit_v2(void);

int main(void)
{
    int failed = 0;

    /* Resolved through the executable's own DT_NEEDED entries at start. */
    printf("CALLED cuInit=%d nvmlInit_v2=%d\n", cuInit(), nvmlInit_v2());
    /* RTLD_NOLOAD: the objects already loaded under these sonames, not a new search. */
    failed |= report("libcuda.so.1", dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "cuInit");
    failed |= report("libnvidia-ml.so.1", dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD),
                     "nvmlInit_v2");
    return failed;
}
#else
int main(int argc, char **argv)
{
    int failed = 0;

    for (int i = 1; i < argc; i++) {
        char *soname = argv[i];
        char *symbol = strchr(soname, ':');
        if (symbol == NULL) {
            fprintf(stderr, "usage: %s SONAME:SYMBOL...\n", argv[0]);
            return 2;
        }
        *symbol++ = '\0';
        failed |= report(soname, dlopen(soname, RTLD_NOW | RTLD_LOCAL), symbol);
    }
    return failed;
}
#endif
