# An SSH-reachable driver host: sshd and a Python 3; perfpipe ships the driver itself.
FROM debian:12.8-slim
RUN apt-get update && apt-get install -y --no-install-recommends openssh-server python3 \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /run/sshd /opt/perfpipe /var/tmp/perfpipe
COPY infra/docker/sshd_config /etc/ssh/sshd_config.d/perfpipe.conf
CMD ["/usr/sbin/sshd", "-D", "-e"]
