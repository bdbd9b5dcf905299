//go:build k8spre1.37

package kubeletdra

import v1 "k8s.io/api/core/v1"

// declareFeatures does nothing: Node.status.declaredFeatures is new in Kubernetes 1.37.
func declareFeatures(*v1.Node) {}
