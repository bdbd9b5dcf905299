//go:build !k8spre1.37

package testplugin

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// healthOptions turns the helper's health service on when a health file is given
// (the kubeletplugin health service exists since 1.37; see health_pre137.go).
func healthOptions(file string) ([]kubeletplugin.Option, error) {
	return []kubeletplugin.Option{kubeletplugin.HealthService(file != "")}, nil
}

func (p *plugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if p.health == "" {
		return kubeletplugin.ErrHealthNotSupported
	}
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	var last string
	sent := time.Time{}
	for {
		data, _ := os.ReadFile(p.health)
		unhealthy := map[string]bool{}
		for _, line := range strings.Split(string(data), "\n") {
			if s := strings.TrimSpace(line); s != "" {
				unhealthy[s] = true
			}
		}
		key := fmt.Sprint(unhealthy)
		if key != last || time.Since(sent) > 10*time.Second {
			var report kubeletplugin.DeviceHealthReport
			for _, d := range p.devices {
				h := kubeletplugin.DeviceHealth{PoolName: p.pool, DeviceName: d, Health: kubeletplugin.HealthStatusHealthy, LastUpdated: time.Now()}
				if unhealthy[d] {
					h.Health = kubeletplugin.HealthStatusUnhealthy
					h.Message = "marked unhealthy in " + p.health
				}
				report.Devices = append(report.Devices, h)
			}
			select {
			case <-ctx.Done():
				return nil
			case reports <- report:
			}
			last, sent = key, time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}
