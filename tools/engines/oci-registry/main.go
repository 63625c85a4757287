// Command oci-registry serves go-containerregistry's registry (pkg/registry, the OCI distribution API) over TLS.
//
// The module's own commands serve plain HTTP, which Helm's OCI client refuses unless told otherwise, and the
// pulumi-kubernetes provider never tells it. A local plane's chart mirror is therefore served the way a company's
// is: HTTPS, with a certificate the clients' trust store (SSL_CERT_FILE) accepts. Blobs live on disk, manifests in
// memory: the mirror lives as long as the plane. Beside the registry, /files/ serves a directory as an artifact
// server does (the CRD files a stack takes apart from their charts).
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:5000", "address to serve on")
	cert := flag.String("cert", "", "PEM certificate the server presents")
	key := flag.String("key", "", "PEM key of the certificate")
	disk := flag.String("disk", "", "directory for blobs (memory when empty)")
	files := flag.String("files", "", "directory served under /files/ (none when empty)")
	flag.Parse()
	if *cert == "" || *key == "" {
		log.Fatal("--cert and --key are required: the registry serves HTTPS only")
	}
	options := []registry.Option{registry.Logger(log.New(os.Stderr, "", log.LstdFlags))}
	if *disk != "" {
		options = append(options, registry.WithBlobHandler(registry.NewDiskBlobHandler(*disk)))
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v2/", registry.New(options...))
	if *files != "" {
		mux.Handle("/files/", http.StripPrefix("/files/", http.FileServer(http.Dir(*files))))
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	log.Printf("serving https://%s", listener.Addr())
	if err := server.ServeTLS(listener, *cert, *key); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
