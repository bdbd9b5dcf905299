// Command pause is the sandbox (infra) container of the real test node: it holds a
// pod's namespaces open, reaps the zombies it inherits as PID 1, and exits on SIGINT or
// SIGTERM so that stopping a sandbox is quick. Built static so its image needs no libc.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			// Reap every exited child; stop when none is left to wait for.
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
