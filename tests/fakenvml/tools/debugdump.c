/*
 * Stand-in nvidia-debugdump (docs/standin-driver.md): prints its name and the driver version
 * it was built for, whatever it is asked, as the driver root's shell-script tools did.
 */
#include "common.h"

int main(void) {
    printf("nvidia-debugdump %s\n", STANDIN_DRIVER_VERSION);
    return 0;
}
