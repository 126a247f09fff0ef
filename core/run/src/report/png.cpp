// `loom report --png DIR`: each chart's SVG rendered by librsvg onto a cairo image surface.
#include <system_error>

#include "loom/error.hpp"
#include "loom/run/report.hpp"

#if LOOM_HAVE_RSVG
#include <cairo.h>
#include <librsvg/rsvg.h>
#endif

namespace fs = std::filesystem;

namespace loom {

bool report_png_available() {
  return LOOM_HAVE_RSVG != 0;
}

#if LOOM_HAVE_RSVG

namespace {

void render_png(const ReportChart& chart, const fs::path& file) {
  const std::string svg = standalone_svg(chart);
  GError* error = nullptr;
  RsvgHandle* handle =
      rsvg_handle_new_from_data(reinterpret_cast<const guint8*>(svg.data()), static_cast<gsize>(svg.size()), &error);
  if (!handle) {
    const std::string why = error ? error->message : "unknown error";
    if (error) g_error_free(error);
    throw InternalError("librsvg could not read chart '" + chart.id + "': " + why);
  }
  // Twice the SVG's size: sharp in a README or a paper.
  const double scale = 2;
  const int width = static_cast<int>(chart.width * scale), height = static_cast<int>(chart.height * scale);
  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, width, height);
  cairo_t* cr = cairo_create(surface);
  const RsvgRectangle viewport{0, 0, static_cast<double>(width), static_cast<double>(height)};
  const bool drawn = rsvg_handle_render_document(handle, cr, &viewport, &error);
  cairo_destroy(cr);
  g_object_unref(handle);
  std::string why;
  if (!drawn) {
    why = error ? error->message : "unknown error";
    if (error) g_error_free(error);
  }
  const cairo_status_t written = drawn ? cairo_surface_write_to_png(surface, file.c_str()) : CAIRO_STATUS_SUCCESS;
  cairo_surface_destroy(surface);
  if (!drawn) throw InternalError("librsvg could not draw chart '" + chart.id + "': " + why);
  if (written != CAIRO_STATUS_SUCCESS)
    throw UserError("cannot write '" + file.string() + "': " + cairo_status_to_string(written));
}

}  // namespace

void write_report_pngs(const std::vector<ReportChart>& charts, const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw UserError("--png: cannot create the directory '" + dir.string() + "'");
  for (const auto& chart : charts) render_png(chart, dir / (chart.id + ".png"));
}

#else

void write_report_pngs(const std::vector<ReportChart>&, const fs::path&) {
  throw UserError(
      "--png is not available in this build: loom was configured without librsvg and cairo (Debian: apt-get "
      "install librsvg2-dev, as scripts/install-deps.sh does, then configure again)");
}

#endif

}  // namespace loom
