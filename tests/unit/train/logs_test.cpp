// The logs people look at: TFRecord/CRC32C framing and Event encoding,
// metrics.csv rows (live and rebuilt on resume), overlay composition and
// PNG encoding.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "memtrain/metrics/overlay.h"
#include "memtrain/train/logs/metrics.h"
#include "memtrain/train/logs/run_plot.h"
#include "memtrain/util/png.h"
#include "memtrain/util/tb_events.h"
#include "test_support.h"

namespace memtrain {
namespace {

std::string hexdump(const std::string& s) {
  std::string out;
  char b[4];
  for (unsigned char c : s) {
    std::snprintf(b, sizeof b, "%02x", c);
    out += b;
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TbEvents, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // ((c >> 15) | (c << 17)) + 0xa282ead8 of 0xE3069283
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xC78AB0E5u);
}

TEST(TbEvents, ScalarEventBytes) {
  // Event{wall_time: 1.0 (field 1, fixed64), step: 5 (field 2, varint),
  // summary (field 5) {value (1) {tag (1): "a", simple_value (2): 1.0f}}}
  EXPECT_EQ(
      hexdump(tb::scalars_event(1.0, 5, {{"a", 1.0f}})),
      "09000000000000f03f"
      "1005"
      "2a0a0a080a0161150000803f");
  EXPECT_EQ(
      hexdump(tb::session_start_event(0.0, 300)),
      "090000000000000000"
      "10ac02"      // 300 as a varint
      "3a020801");  // session_log (7) {status (1): START}
  EXPECT_EQ(
      hexdump(tb::file_version_event(0.0)),
      "090000000000000000"
      "1a0d" +
          hexdump("brain.Event:2"));
}

TEST(TbEvents, RecordFraming) {
  const std::string data = "123456789";
  const std::string r = tb::record(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  uint64_t n = 0;
  uint32_t len_crc = 0, data_crc = 0;
  std::memcpy(&n, r.data(), 8);
  std::memcpy(&len_crc, r.data() + 8, 4);
  std::memcpy(&data_crc, r.data() + 12 + data.size(), 4);
  EXPECT_EQ(n, data.size());
  EXPECT_EQ(len_crc, masked_crc32c(r.data(), 8));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(data_crc, 0xC78AB0E5u);
}

TEST(Overlay, ComposesImageLabelAndPredictionPanels) {
  // A 2 x 2 slice at scale 1: image values 0, 1, 2, 4 -> grey 0, 64, 128,
  // 255; label 1 at pixel 1, prediction 2 at pixel 3.
  const float image[] = {0, 1, 2, 4};
  const int64_t label[] = {0, 1, 0, 0};
  const int64_t pred[] = {0, 0, 0, 2};
  const RgbImage out = compose_overlay(image, label, pred, 2, 2, 1);
  ASSERT_EQ(out.width, 6);
  ASSERT_EQ(out.height, 2);
  auto px = [&](int64_t x, int64_t y) {
    const uint8_t* p = &out.rgb[(y * out.width + x) * 3];
    return std::array<int, 3>{p[0], p[1], p[2]};
  };
  const std::array<int, 3> g0{0, 0, 0}, g64{64, 64, 64}, g128{128, 128, 128},
      g255{255, 255, 255};
  // image panel: grey everywhere
  EXPECT_EQ(px(0, 0), g0);
  EXPECT_EQ(px(1, 0), g64);
  EXPECT_EQ(px(0, 1), g128);
  EXPECT_EQ(px(1, 1), g255);
  // label panel: pixel 1 = (64 + red) / 2, others grey
  const auto red = class_colour(1), green = class_colour(2);
  EXPECT_EQ(
      px(3, 0),
      (std::array<int, 3>{
          (64 + red[0]) / 2, (64 + red[1]) / 2, (64 + red[2]) / 2}));
  EXPECT_EQ(px(2, 0), g0);
  EXPECT_EQ(px(3, 1), g255);
  // prediction panel: pixel 3 = (255 + green) / 2
  EXPECT_EQ(
      px(5, 1),
      (std::array<int, 3>{
          (255 + green[0]) / 2, (255 + green[1]) / 2, (255 + green[2]) / 2}));
  EXPECT_EQ(px(5, 0), g64);
  EXPECT_EQ(overlay_scale(32, 32), 8);
  EXPECT_EQ(overlay_scale(300, 20), 1);
  // Scaled: every pixel is a scale x scale block.
  const RgbImage big = compose_overlay(image, label, pred, 2, 2, 3);
  ASSERT_EQ(big.width, 18);
  ASSERT_EQ(big.height, 6);
  EXPECT_EQ(big.rgb[(5 * 18 + 17) * 3 + 1], (255 + green[1]) / 2);
}

TEST(Png, HeaderHasTheImageSize) {
  RgbImage img;
  img.width = 5;
  img.height = 3;
  img.rgb.assign(5 * 3 * 3, 7);
  const std::string png = encode_png(img);
  ASSERT_GT(png.size(), 33u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  auto be32 = [&](size_t at) {
    const auto* p = reinterpret_cast<const unsigned char*>(png.data() + at);
    return (uint32_t(p[0]) << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
  };
  EXPECT_EQ(be32(16), 5u);
  EXPECT_EQ(be32(20), 3u);
  EXPECT_EQ(png[24], 8);  // bit depth
  EXPECT_EQ(png[25], 2);  // RGB
}

nlohmann::json window(int64_t step, int64_t epoch, double loss) {
  return {
      {"type", "window"},
      {"step", step},
      {"epoch", epoch},
      {"window", step},
      {"loss", loss},
      {"lr", 0.5},
      {"mem_peak", 1024},
      {"samples", 8}};
}

TEST(MetricsLog, CsvRowsCarryTheEpochOnItsLastWindowAndRebuildOnResume) {
  test::TempDir dir("csv");
  MetricsOutputs out;
  out.dir = dir.path();
  out.val_metrics = {"val_dice"};
  out.dice_classes = metrics_class_names({"bg", "liver"}, 3);
  out.draw_progress = false;
  EXPECT_EQ(out.dice_classes, (std::vector<std::string>{"bg", "liver", "2"}));
  const std::string header =
      "step,epoch,window,loss,lr,samples_per_s,samples,effective_batch,"
      "micro_batch,accum_steps,window_s,t_data_s,t_compute_s,"
      "t_comm_exposed_s,t_optimizer_s,host_syncs,mem_allocated,"
      "mem_reserved,mem_peak,"
      "mem_peak_reserved,host_reserved,host_peak,oom_retries,cache_releases,"
      "skipped_steps,"
      "train_loss,val_loss,val_dice,val_dice_bg,val_dice_liver,val_dice_2\n";
  {
    MetricsLog log(out);
    log.write(window(1, 0, 2.5));
    log.write(window(2, 0, 1.25));
    log.write(
        {{"type", "validation"},
         {"epoch", 0},
         {"val_loss", 0.75},
         {"val_dice", 0.5},
         {"val_dice_per_class", {0.9, 0.5, nullptr}}});
    log.write(
        {{"type", "epoch"},
         {"epoch", 0},
         {"train_loss", 1.875},
         {"val_loss", 0.75},
         {"val_dice", 0.5}});
    log.write(window(3, 1, 1.0));
    // the last row comes out when the log closes
    EXPECT_EQ(
        read_file(dir.file("metrics.csv")),
        header + "1,0,1,2.5,0.5,,8,,,,,,,,,,,,1024,,,,,,,,,,,,\n" +
            "2,0,2,1.25,0.5,,8,,,,,,,,,,,,1024,,,,,,,1.875,0.75,0.5,0.9,0.5,"
            "\n");
  }
  const std::string full = read_file(dir.file("metrics.csv"));
  EXPECT_EQ(
      full.substr(full.rfind('\n', full.size() - 2) + 1),
      "3,1,3,1.0,0.5,,8,,,,,,,,,,,,1024,,,,,,,,,,,,\n");
  // Resumed after trimming to step 2: the CSV is rebuilt from metrics.jsonl.
  {
    std::ifstream in(dir.file("metrics.jsonl"));
    std::string line, kept;
    while (std::getline(in, line)) {
      if (nlohmann::json::parse(line).value("step", 0) != 3)
        kept += line + "\n";
    }
    std::ofstream(dir.file("metrics.jsonl")) << kept;
  }
  out.resumed = true;
  out.resume_step = 2;
  out.resume_epoch = 1;  // the checkpoint at epoch 0's end
  {
    MetricsLog log(out);
    log.write(window(3, 1, 0.5));
  }
  const std::string rows12 =
      header + "1,0,1,2.5,0.5,,8,,,,,,,,,,,,1024,,,,,,,,,,,,\n" +
      "2,0,2,1.25,0.5,,8,,,,,,,,,,,,1024,,,,,,,1.875,0.75,0.5,0.9,0.5,\n";
  EXPECT_EQ(
      read_file(dir.file("metrics.csv")),
      rows12 + "3,1,3,0.5,0.5,,8,,,,,,,,,,,,1024,,,,,,,,,,,,\n");
  // Resumed at step 3, the last window of epoch 1 (a stop there): the
  // resumed run's validation and epoch records land on that window's row.
  out.resume_step = 3;  // still epoch 1: its records are dropped, none yet
  {
    MetricsLog log(out);
    log.write({{"type", "validation"}, {"epoch", 1}, {"val_loss", 0.5}});
    log.write({{"type", "epoch"}, {"epoch", 1}, {"train_loss", 0.25}});
  }
  EXPECT_EQ(
      read_file(dir.file("metrics.csv")),
      rows12 + "3,1,3,0.5,0.5,,8,,,,,,,,,,,,1024,,,,,,,0.25,,,,,\n");
}

// DIR/metrics.jsonl of these records, one a line.
void write_records(
    const test::TempDir& dir, const std::vector<std::string>& records) {
  std::ofstream out(dir.file("metrics.jsonl"));
  for (const std::string& r : records)
    out << r << "\n";
}

// A skipped window's loss is null in metrics.jsonl: the plot reads it as a
// gap (a blank line in gnuplot's data block), not a JSON type error; a path
// with a newline is refused before it could end a gnuplot command.
TEST(RunPlot, SkippedWindowIsAGapAndANewlineIsRefused) {
  test::TempDir dir("plot");
  write_records(
      dir,
      {R"({"type":"window","step":1,"loss":0.5,"mem_peak":1048576})",
       R"({"type":"window","step":2,"loss":null,"mem_peak":1048576})",
       R"({"type":"window","step":3,"loss":0.25,"mem_peak":2097152})"});
  const RunCurves c = load_run_curves(dir.path());
  ASSERT_EQ(c.loss.size(), 3u);
  EXPECT_TRUE(std::isnan(c.loss[1][1]));
  const std::string script = plot_script({c}, dir.file("p.png"));
  EXPECT_NE(
      script.find("$loss0 << EOD\n1 0.5\n\n3 0.25\nEOD\n"), std::string::npos)
      << script;
  EXPECT_NE(
      test::error_of([&] {
        plot_script({c}, dir.file("a\nb.png"));
      }).find("holds a control character"),
      std::string::npos);
}

// The validation panel draws the task's first metric that has a direction,
// as the validation record's val_metrics lists them (Note [Tasks]); a file
// written before that list existed draws val_dice or val_accuracy.
TEST(RunPlot, ValidationPanelFollowsTheTasksMetricList) {
  test::TempDir dir("plot");
  const std::string order =
      R"("val_metrics":[{"key":"val_mae","better":"lower"},)"
      R"({"key":"val_rmse","better":"lower"}]})";
  write_records(
      dir,
      {R"({"type":"window","step":1,"loss":0.5,"mem_peak":1048576})",
       R"({"type":"validation","epoch":0,"val_loss":0.5,"val_mae":0.25,)"
       R"("val_rmse":0.75,)" +
           order,
       R"({"type":"validation","epoch":1,"val_loss":0.25,"val_mae":0.125,)"
       R"("val_rmse":0.5,)" +
           order});
  const RunCurves c = load_run_curves(dir.path());
  EXPECT_EQ(c.val_metric, "val_mae");
  EXPECT_EQ(c.val_better, "lower");
  ASSERT_EQ(c.val.size(), 2u);
  EXPECT_EQ(c.val[1][0], 2.0);  // epoch 1..
  EXPECT_EQ(c.val[1][1], 0.125);
  const std::string script = plot_script({c}, dir.file("p.png"));
  EXPECT_NE(
      script.find("set ylabel 'val_mae (lower is better)'"), std::string::npos)
      << script;
  EXPECT_NE(
      script.find("$val0 << EOD\n1 0.25\n2 0.125\nEOD\n"), std::string::npos)
      << script;

  test::TempDir old("plot-old");
  write_records(
      old,
      {R"({"type":"window","step":1,"loss":0.5,"mem_peak":1048576})",
       R"({"type":"validation","epoch":0,"val_loss":0.5,"val_accuracy":0.5})"});
  const RunCurves o = load_run_curves(old.path());
  EXPECT_EQ(o.val_metric, "val_accuracy");
  EXPECT_EQ(o.val_better, "higher");
}

}  // namespace
}  // namespace memtrain
