// Package etcd runs an embedded single-member etcd server on loopback.
package etcd

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Main runs the "etcd" subcommand.
func Main(args []string) error {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "directory for etcd data (required)")
	clientURL := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL (loopback only)")
	peerURL := fs.String("listen-peer-url", "", "peer URL (loopback only); default: a free loopback port")
	logLevel := fs.String("log-level", "warn", "etcd log level")
	noFsync := fs.Bool("unsafe-no-fsync", false, "disable fsync (faster, loses data on power loss)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dataDir == "" {
		return errors.New("--data-dir is required")
	}
	curl, err := loopbackURL(*clientURL)
	if err != nil {
		return fmt.Errorf("--listen-client-url: %w", err)
	}
	if *peerURL == "" {
		port, err := freePort()
		if err != nil {
			return err
		}
		*peerURL = fmt.Sprintf("http://127.0.0.1:%d", port)
	}
	purl, err := loopbackURL(*peerURL)
	if err != nil {
		return fmt.Errorf("--listen-peer-url: %w", err)
	}

	cfg := embed.NewConfig()
	cfg.Name = "testenv"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = *logLevel
	cfg.UnsafeNoFsync = *noFsync

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd ready on %s\n", curl.String())
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		return errors.New("etcd did not become ready within 60s")
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err := <-e.Err():
		return err
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "etcd: got %s, stopping\n", s)
		return nil
	}
}

func loopbackURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	host := u.Hostname()
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("%q is not a loopback address", host)
	}
	return u, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
