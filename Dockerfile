# hostkvd container: a build stage with the toolchain, a slim runtime stage
# with only the shared libraries hostkvd and the hostkv CLI need.
# This image runs the CPU backend; the CUDA build comes with the GPU backend.
FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake g++ make libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
      protobuf-compiler libspdlog-dev libabsl-dev grpc-proto \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DHOSTKV_BUILD_TESTS=OFF \
      -DHOSTKV_ENABLE_CUDA=OFF \
 && cmake --build /build -j"$(nproc)" --target hostkvd hostkv

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libspdlog1.10 \
      libfmt9 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system hostkv \
 && useradd --system --gid hostkv --no-create-home hostkv \
 && mkdir -p /run/hostkv \
 && chown hostkv:hostkv /run/hostkv
COPY --from=build /build/server/hostkvd /build/client/hostkv /usr/local/bin/
COPY deploy/entrypoint.sh /usr/local/bin/hostkvd-entrypoint
USER hostkv
VOLUME ["/run/hostkv"]
HEALTHCHECK --interval=10s --timeout=3s CMD ["hostkv", "stats"]
ENTRYPOINT ["/usr/local/bin/hostkvd-entrypoint"]
CMD ["--listen=unix:/run/hostkv/hostkvd.sock"]
