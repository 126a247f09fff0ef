// TFRecord framing, the container of TensorBoard's event files (tensorflow/core/lib/io/record_writer.cc):
//
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::tensorboard {

// CRC-32C (Castagnoli polynomial, reflected; RFC 3720 appendix B.4), as TFRecord uses it.
std::uint32_t crc32c(std::string_view data);

// TFRecord's masked CRC: rotated right by 15 bits plus a constant, so that the CRC of data that
// itself contains CRCs stays well distributed.
std::uint32_t masked_crc32c(std::string_view data);

// `data` framed as one record.
std::string tfrecord(std::string_view data);

}  // namespace loom::tensorboard
