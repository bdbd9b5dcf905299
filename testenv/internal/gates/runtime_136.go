//go:build k8spre1.37 && !k8spre1.36

package gates

// releaseRuntimeConfig: in 1.36 the workload API that GenericWorkload (needed by
// DRAWorkloadResourceClaims) serves is scheduling.k8s.io/v1alpha2; without it the API
// server never reports ready (its informers for Workload and PodGroup never start).
var releaseRuntimeConfig = []string{"scheduling.k8s.io/v1alpha2"}
