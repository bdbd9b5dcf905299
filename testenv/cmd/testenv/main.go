// Command testenv bundles what a local Kubernetes control plane for DRA
// tests needs into one binary, built from the upstream Go modules:
//
//	testenv etcd                     embedded etcd on loopback
//	testenv kube-apiserver ...       upstream kube-apiserver command
//	testenv kube-scheduler ...       upstream kube-scheduler command
//	testenv kube-controller-manager  upstream kube-controller-manager command
//	testenv kubelet ...              upstream kubelet command (a real node)
//	testenv kubelet-dra ...          the kubelet's DRA code for one node, no containers
//	testenv keys --dir D             service-account keys and serving certificates
//	testenv feature-gates            the DRA feature gates of this release
//	testenv runtime-config           the API versions those gates need
//	testenv testplugin ...           a trivial DRA kubelet plugin
//	testenv version                  the Kubernetes version
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"draplugin.test/testenv/internal/buildinfo"
	"draplugin.test/testenv/internal/etcd"
	"draplugin.test/testenv/internal/gates"
	"draplugin.test/testenv/internal/keys"
	"draplugin.test/testenv/internal/kubeletdra"
	"draplugin.test/testenv/internal/testplugin"
)

const usage = `usage: testenv <command> [flags]

commands:
  etcd                     embedded etcd (--data-dir, --listen-client-url)
  kube-apiserver           upstream kube-apiserver
  kube-scheduler           upstream kube-scheduler
  kube-controller-manager  upstream kube-controller-manager
  kubelet                  upstream kubelet (needs root, a container runtime)
  kubelet-dra              kubelet DRA manager + plugin manager for one node
  keys                     write service-account keys and certificates (--dir)
  feature-gates            print --feature-gates value enabling all DRA gates (--list: one per line)
  runtime-config           print --runtime-config value for the DRA API versions
  controllers              print the controllers kube-controller-manager knows, one per line
  testplugin               trivial DRA kubelet plugin for harness tests
  version                  print the Kubernetes version
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "kube-apiserver":
		os.Exit(runCobra(cmd, args, "apiserver"))
	case "kube-scheduler":
		os.Exit(runCobra(cmd, args, "scheduler"))
	case "kube-controller-manager":
		os.Exit(runCobra(cmd, args, "controller-manager"))
	case "kubelet":
		os.Exit(runCobra(cmd, args, "kubelet"))
	case "etcd":
		err = etcd.Main(args)
	case "keys":
		err = keys.Main(args)
	case "kubelet-dra":
		err = kubeletdra.Main(args)
	case "testplugin":
		err = testplugin.Main(args)
	case "feature-gates":
		err = printGates(args)
	case "runtime-config":
		fmt.Println(gates.RuntimeConfigValue())
	case "controllers":
		// Newer releases add controllers (resourcepoolstatusrequest-controller in 1.36);
		// naming an unknown one stops kube-controller-manager.
		for _, c := range controllermanager.KnownControllers() {
			fmt.Println(c)
		}
	case "version":
		fmt.Println(buildinfo.KubernetesVersion())
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "testenv: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

func runCobra(name string, args []string, which string) int {
	os.Args = append([]string{filepath.Join(filepath.Dir(os.Args[0]), name)}, args...)
	switch which {
	case "apiserver":
		c := apiserver.NewAPIServerCommand()
		c.SetArgs(args)
		return cli.Run(c)
	case "scheduler":
		c := scheduler.NewSchedulerCommand()
		c.SetArgs(args)
		return cli.Run(c)
	case "kubelet":
		c := kubelet.NewKubeletCommand(context.Background())
		c.SetArgs(args)
		return cli.Run(c)
	default:
		c := controllermanager.NewControllerManagerCommand()
		c.SetArgs(args)
		return cli.Run(c)
	}
}

func printGates(args []string) error {
	gs, err := gates.Selected()
	if err != nil {
		return err
	}
	if len(args) > 0 && args[0] == "--list" {
		for _, g := range gs {
			stage := g.Stage
			if stage == "" {
				stage = "GA"
			}
			fmt.Printf("%s\t%s\tdefault=%v\t%s\n", g.Name, stage, g.Default, g.Reason)
		}
		return nil
	}
	fmt.Println(gates.FlagValue(gs))
	return nil
}
