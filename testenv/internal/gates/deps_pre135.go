//go:build k8spre1.35

package gates

import "k8s.io/component-base/featuregate"

// dependencies: the feature registry declares dependencies between gates since 1.35;
// before, there are none to follow (every DRA gate is selected by name anyway).
func dependencies() map[featuregate.Feature][]featuregate.Feature { return nil }
