# The tether image: one static binary on an empty base. It builds offline:
# `make image` compiles bin/tether-static on the host (CGO_ENABLED=0, so it
# needs no libc) and this file only copies it; no base image is pulled and
# nothing runs inside the build.
FROM scratch
COPY bin/tether-static /tether
# Not root (there are no users in scratch: numeric ids). Mount the edge's
# data_dir (cluster.data_dir, /var/lib/tether in deploy/) writable for it.
USER 65532:65532
# The edge's HTTP listener and Raft port, a worker's listener (deploy/).
EXPOSE 8000 7400 9000
ENTRYPOINT ["/tether"]
