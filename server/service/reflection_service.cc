#include "server/service/reflection_service.h"

#include <deque>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace hostkv {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::FileDescriptorProto;

ReflectionService::ReflectionService(const std::string& auth_token,
                                     std::vector<std::string> services)
    : authorizer_(auth_token),
      services_(std::move(services)),
      pool_(google::protobuf::DescriptorPool::generated_pool()) {}

grpc::Status ReflectionService::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<Response, Request>* stream) {
  if (grpc::Status auth = authorizer_.Check(*context); !auth.ok()) return auth;
  Request request;
  while (stream->Read(&request)) {
    Response response;
    Answer(request, &response);
    if (!stream->Write(response)) break;
  }
  return grpc::Status::OK;
}

void ReflectionService::Answer(const Request& request,
                               Response* response) const {
  response->set_valid_host(request.host());
  *response->mutable_original_request() = request;
  switch (request.message_request_case()) {
    case Request::kListServices:
      for (const std::string& name : services_) {
        response->mutable_list_services_response()->add_service()->set_name(
            name);
      }
      return;
    case Request::kFileByFilename:
      if (const FileDescriptor* file =
              pool_->FindFileByName(request.file_by_filename())) {
        return AddFileWithDependencies(file, response);
      }
      return SetNotFound("file " + request.file_by_filename(), response);
    case Request::kFileContainingSymbol:
      if (const FileDescriptor* file = pool_->FindFileContainingSymbol(
              request.file_containing_symbol())) {
        return AddFileWithDependencies(file, response);
      }
      return SetNotFound("symbol " + request.file_containing_symbol(),
                         response);
    case Request::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const Descriptor* type =
          pool_->FindMessageTypeByName(ext.containing_type());
      const FieldDescriptor* field =
          type == nullptr
              ? nullptr
              : pool_->FindExtensionByNumber(type, ext.extension_number());
      if (field != nullptr)
        return AddFileWithDependencies(field->file(), response);
      return SetNotFound(absl::StrCat("extension ", ext.extension_number(),
                                      " of ", ext.containing_type()),
                         response);
    }
    case Request::kAllExtensionNumbersOfType:
      return AddExtensionNumbers(request.all_extension_numbers_of_type(),
                                 response);
    case Request::MESSAGE_REQUEST_NOT_SET:
      break;
  }
  response->mutable_error_response()->set_error_code(
      static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT));
  response->mutable_error_response()->set_error_message(
      "empty reflection request");
}

void ReflectionService::AddFileWithDependencies(const FileDescriptor* file,
                                                Response* response) {
  auto* files = response->mutable_file_descriptor_response();
  absl::flat_hash_set<const FileDescriptor*> seen = {file};
  std::deque<const FileDescriptor*> pending = {file};
  while (!pending.empty()) {
    const FileDescriptor* f = pending.front();
    pending.pop_front();
    FileDescriptorProto proto;
    f->CopyTo(&proto);
    proto.SerializeToString(files->add_file_descriptor_proto());
    for (int i = 0; i < f->dependency_count(); ++i) {
      if (seen.insert(f->dependency(i)).second)
        pending.push_back(f->dependency(i));
    }
  }
}

void ReflectionService::AddExtensionNumbers(const std::string& type,
                                            Response* response) const {
  const Descriptor* descriptor = pool_->FindMessageTypeByName(type);
  if (descriptor == nullptr) return SetNotFound("type " + type, response);
  std::vector<const FieldDescriptor*> extensions;
  pool_->FindAllExtensions(descriptor, &extensions);
  auto* numbers = response->mutable_all_extension_numbers_response();
  numbers->set_base_type_name(type);
  for (const FieldDescriptor* e : extensions)
    numbers->add_extension_number(e->number());
}

void ReflectionService::SetNotFound(const std::string& what,
                                    Response* response) {
  response->mutable_error_response()->set_error_code(
      static_cast<int32_t>(grpc::StatusCode::NOT_FOUND));
  response->mutable_error_response()->set_error_message(what + " not found");
}

}  // namespace hostkv
