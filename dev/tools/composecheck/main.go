// compose-check loads a Compose file the way `docker compose config` does (compose-go: schema
// validation, interpolation, normalisation) and prints the resolved project, without a Docker
// engine. Usage: compose-check FILE...
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compose-check FILE...")
		os.Exit(2)
	}
	opts, err := cli.NewProjectOptions(os.Args[1:], cli.WithOsEnv, cli.WithName("kdelay"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose-check:", err)
		os.Exit(1)
	}
	project, err := cli.ProjectFromOptions(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose-check:", err)
		os.Exit(1)
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose-check:", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}
