// Command pulumi-resource-kubernetes serves the pulumi-kubernetes provider from its published Go module.
//
// The module's own main embeds files that `go generate` writes and git ignores, so it does not build as published.
// This main embeds the schema the module commits instead; `triarch local build` copies it here (with its version
// set) before building, and stamps the provider's version variable.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema.json
var schema []byte

func main() {
	// No Terraform mapping: it serves `pulumi convert` from Terraform only.
	provider.Serve("kubernetes", version.Version, schema, nil)
}
