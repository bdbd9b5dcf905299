//go:build !k8spre1.37 || k8spre1.36

package gates

// releaseRuntimeConfig: API versions only some releases serve (see runtime_136.go).
var releaseRuntimeConfig []string
