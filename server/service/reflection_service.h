// grpc.reflection.v1alpha.ServerReflection (what grpcurl uses), behind the
// daemon's token. gRPC 1.51's reflection plugin has no hook for a token
// check, and InsecureServerCredentials cannot take an auth metadata
// processor, so the daemon answers reflection itself.
#ifndef HOSTKV_SERVER_SERVICE_REFLECTION_SERVICE_H_
#define HOSTKV_SERVER_SERVICE_REFLECTION_SERVICE_H_

#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "server/service/auth_token.h"

namespace hostkv {

// Describes the files of `google::protobuf::DescriptorPool::generated_pool()`:
// the services and messages compiled into the daemon. Immutable after
// construction, so thread-safe.
class ReflectionService final
    : public grpc::reflection::v1alpha::ServerReflection::Service {
 public:
  // `services`: the full names list_services answers (the ones the daemon
  // registers). An empty `auth_token` requires none.
  ReflectionService(const std::string& auth_token,
                    std::vector<std::string> services);

  // UNAUTHENTICATED without the token. Otherwise one response per request;
  // a name that is not found gets an error_response with NOT_FOUND.
  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<
          grpc::reflection::v1alpha::ServerReflectionResponse,
          grpc::reflection::v1alpha::ServerReflectionRequest>* stream) override;

 private:
  using Request = grpc::reflection::v1alpha::ServerReflectionRequest;
  using Response = grpc::reflection::v1alpha::ServerReflectionResponse;

  void Answer(const Request& request, Response* response) const;
  // `file` and everything it imports, transitively, each once.
  static void AddFileWithDependencies(
      const google::protobuf::FileDescriptor* file, Response* response);
  void AddExtensionNumbers(const std::string& type, Response* response) const;
  static void SetNotFound(const std::string& what, Response* response);

  const TokenAuthorizer authorizer_;
  const std::vector<std::string> services_;
  const google::protobuf::DescriptorPool* const pool_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_REFLECTION_SERVICE_H_
