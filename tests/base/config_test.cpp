// SPDX-License-Identifier: MIT
// Unit tests of the RSTREAM_* registry: its getters, and its agreement with the README's
// variable table and man 7 rstream's ENVIRONMENT section (RSTREAM_SOURCE_ROOT, from meson).

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "configvars.h"

using namespace rstream;
using namespace rstream::config;

namespace {

// ---- Getters ----------------------------------------------------------------------------------

// Sets a variable for one scope.
class Env
{
public:
    Env(const char *name, const char *value) : name_(name)
    {
        if (const char *old = std::getenv(name))
            old_ = old, had_ = true;
        if (value)
            setenv(name, value, 1);
        else
            unsetenv(name);
    }
    ~Env()
    {
        if (had_)
            setenv(name_, old_.c_str(), 1);
        else
            unsetenv(name_);
    }

private:
    const char *name_;
    std::string old_;
    bool had_ = false;
};

// Read from a static initializer, as the libraries' load-time constructors do: the table and
// the warning flags are constant initialized, so no initialization order can bite.
const int64_t gEarlyPollUs = getInt("RSTREAM_POLL_US");
const bool gEarlyBacktrace = getFlag("RSTREAM_BACKTRACE");

int64_t parseText(const char *name, const char *text, int *rc)
{
    int64_t v = -12345;
    *rc = parse(*find(name), text, &v);
    return v;
}

} // namespace

TEST(Config, TableIsWellFormed)
{
    std::set<std::string> names;
    for (const ConfigVar &v : vars()) {
        SCOPED_TRACE(v.name);
        EXPECT_EQ(std::string(v.name).rfind("RSTREAM_", 0), 0u);
        EXPECT_TRUE(names.insert(v.name).second) << "twice in the table";
        EXPECT_EQ(find(v.name), &v);
        EXPECT_TRUE(v.meaning && *v.meaning);
        EXPECT_LE(v.min, v.max);
        // The default is valid for the variable's own kind and range.
        int64_t d;
        if (v.kind != Kind::Text && *v.defaultText) {
            EXPECT_EQ(parse(v, v.defaultText, &d), 0) << v.defaultText;
        }
    }
    EXPECT_EQ(find("RSTREAM_NO_SUCH_THING"), nullptr);
    EXPECT_EQ(find("RSTREAM_LOG_"), nullptr);
}

TEST(Config, UsableBeforeMain)
{
    int64_t now = -1;
    if (read("RSTREAM_POLL_US", &now) != 0)
        now = 50;
    EXPECT_EQ(gEarlyPollUs, now);
    EXPECT_EQ(gEarlyBacktrace, getFlag("RSTREAM_BACKTRACE"));
}

TEST(Config, NumbersTakeSuffixesAndHex)
{
    int rc;
    EXPECT_EQ(parseText("RSTREAM_SEND_BUF", "64k", &rc), 64 * 1024);
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(parseText("RSTREAM_SEND_BUF", "256M", &rc), 256 << 20);
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(parseText("RSTREAM_SEND_BUF", "0x1000", &rc), 4096);
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(parseText("RSTREAM_TX_SIZE", " 100", &rc), 100);
    EXPECT_EQ(rc, 0);
    for (const char *bad : {"", "1kb", "-1", " -1", "1.5k", "lots", "1t", "0x"}) {
        int64_t v = -7;
        EXPECT_NE(parse(*find("RSTREAM_SEND_BUF"), bad, &v), 0) << bad;
        EXPECT_EQ(v, -7) << "untouched on failure: " << bad;
    }
}

TEST(Config, RangesAreInclusive)
{
    int rc;
    struct Case
    {
        const char *name, *low, *high, *below, *above;
    };
    for (Case c : {Case{"RSTREAM_SEND_BUF", "1k", "256m", "1023", "0x10000001"},
                   Case{"RSTREAM_TX_SIZE", "8", "8191", "7", "8192"},
                   Case{"RSTREAM_POLL_US", "0", "1000000", nullptr, "1000001"},
                   Case{"RSTREAM_CONNECT_TIMEOUT_MS", "1", "3600000", "0", "3600001"},
                   Case{"RSTREAM_PORT_OFFSET", "0", "65535", nullptr, "65536"},
                   Case{"RSTREAM_NEGATIVE_CACHE_MS", "0", "86400000", nullptr, "86400001"},
                   Case{"RSTREAM_NOFILE_ORIG", "1", "18446744073709551615k", "0", nullptr}}) {
        SCOPED_TRACE(c.name);
        const ConfigVar &v = *find(c.name);
        EXPECT_EQ(parseText(c.name, c.low, &rc), v.min);
        EXPECT_EQ(rc, 0);
        if (v.max != INT64_MAX) {
            EXPECT_EQ(parseText(c.name, c.high, &rc), v.max);
            EXPECT_EQ(rc, 0);
        } else {
            parseText(c.name, c.high, &rc);
            EXPECT_EQ(rc, -EINVAL) << "beyond int64_t";
        }
        if (c.below) {
            parseText(c.name, c.below, &rc);
            EXPECT_EQ(rc, -EINVAL);
        }
        if (c.above) {
            parseText(c.name, c.above, &rc);
            EXPECT_EQ(rc, -EINVAL);
        }
    }
}

TEST(Config, ZeroTurnsGrowthOff)
{
    int rc;
    EXPECT_EQ(parseText("RSTREAM_SEND_BUF_MAX", "0", &rc), 0);
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(parseText("RSTREAM_RECV_BUF_MAX", "4m", &rc), 4 << 20);
    EXPECT_EQ(rc, 0);
    parseText("RSTREAM_SEND_BUF_MAX", "1", &rc);
    EXPECT_EQ(rc, -EINVAL) << "not 0, and under the minimum";
    parseText("RSTREAM_SEND_BUF", "0", &rc);
    EXPECT_EQ(rc, -EINVAL) << "the initial size has no off";
}

TEST(Config, FlagsAndLevels)
{
    int rc;
    EXPECT_EQ(parseText("RSTREAM_IWARP", "0", &rc), 0);
    EXPECT_EQ(parseText("RSTREAM_IWARP", "1", &rc), 1);
    EXPECT_EQ(parseText("RSTREAM_IWARP", "2", &rc), 1) << "any number but 0 is on";
    parseText("RSTREAM_BACKTRACE", "off", &rc);
    EXPECT_EQ(rc, -EINVAL);
    EXPECT_EQ(parseText("RSTREAM_LOG", "error", &rc), 0);
    EXPECT_EQ(parseText("RSTREAM_LOG", "DEBUG", &rc), 3);
    EXPECT_EQ(parseText("RSTREAM_LOG", "trace", &rc), 4);
    parseText("RSTREAM_LOG", "3", &rc);
    EXPECT_EQ(rc, -EINVAL) << "levels go by name";
    parseText("RSTREAM_LOG", "", &rc);
    EXPECT_EQ(rc, -ENOENT);
    EXPECT_EQ(defaultValue(*find("RSTREAM_LOG")), 1);
    EXPECT_EQ(defaultValue(*find("RSTREAM_SEND_BUF")), 32 * 1024);
    EXPECT_EQ(defaultValue(*find("RSTREAM_SEND_BUF_MAX")), 1 << 20);
    EXPECT_EQ(defaultValue(*find("RSTREAM_BACKTRACE")), 1);
    EXPECT_EQ(defaultValue(*find("RSTREAM_PROVIDER")), 0);
}

TEST(Config, ReadTellsUnsetFromInvalid)
{
    int64_t v = -1;
    {
        Env e("RSTREAM_POLL_US", nullptr);
        EXPECT_EQ(read("RSTREAM_POLL_US", &v), -ENOENT);
    }
    {
        Env e("RSTREAM_POLL_US", "");
        EXPECT_EQ(read("RSTREAM_POLL_US", &v), -ENOENT);
    }
    {
        Env e("RSTREAM_POLL_US", "7");
        EXPECT_EQ(read("RSTREAM_POLL_US", &v), 0);
        EXPECT_EQ(v, 7);
    }
    {
        Env e("RSTREAM_POLL_US", "2000000");
        EXPECT_EQ(read("RSTREAM_POLL_US", &v), -EINVAL);
    }
    EXPECT_EQ(read("RSTREAM_NO_SUCH_THING", &v), -EINVAL);
}

TEST(Config, GettersFallBackToTheDefault)
{
    {
        Env e("RSTREAM_NEGATIVE_CACHE_MS", nullptr);
        EXPECT_EQ(getInt("RSTREAM_NEGATIVE_CACHE_MS"), 30000);
        EXPECT_EQ(getInt("RSTREAM_NEGATIVE_CACHE_MS", 5), 5);
    }
    {
        Env e("RSTREAM_NEGATIVE_CACHE_MS", "1k");
        EXPECT_EQ(getInt("RSTREAM_NEGATIVE_CACHE_MS"), 1024);
    }
    {
        Env e("RSTREAM_NEGATIVE_CACHE_MS", "-5");
        EXPECT_EQ(getInt("RSTREAM_NEGATIVE_CACHE_MS"), 30000);
    }
    {
        Env e("RSTREAM_PORT_OFFSET", "70000");
        EXPECT_EQ(getInt("RSTREAM_PORT_OFFSET"), 20000);
        EXPECT_EQ(getInt("RSTREAM_PORT_OFFSET", 0), 0) << "the caller's default (verbs)";
    }
    {
        Env e("RSTREAM_ENABLE", "0");
        EXPECT_FALSE(getFlag("RSTREAM_ENABLE"));
    }
    {
        Env e("RSTREAM_ENABLE", "no");
        EXPECT_TRUE(getFlag("RSTREAM_ENABLE"));
    }
    {
        Env e("RSTREAM_EXPORT", nullptr);
        EXPECT_TRUE(getFlag("RSTREAM_EXPORT"));
    }
    {
        Env e("RSTREAM_STATS", nullptr);
        EXPECT_EQ(getString("RSTREAM_STATS"), nullptr);
    }
    {
        Env e("RSTREAM_STATS", "");
        EXPECT_EQ(getString("RSTREAM_STATS"), nullptr) << "empty is unset";
    }
    {
        Env e("RSTREAM_STATS", "/tmp/s.%p");
        EXPECT_STREQ(getString("RSTREAM_STATS"), "/tmp/s.%p");
    }
    EXPECT_EQ(getString("RSTREAM_NO_SUCH_THING"), nullptr);
    EXPECT_EQ(getInt("RSTREAM_NO_SUCH_THING", 9), 9);
}

// meson sets RSTREAM_LOG_FILE for this test, so that the log can be read back.
TEST(Config, InvalidValuesAreLoggedOnce)
{
    const char *logPath = std::getenv("RSTREAM_LOG_FILE");
    if (!logPath)
        GTEST_SKIP() << "RSTREAM_LOG_FILE not set (run through meson test)";
    std::string path = logPath;
    if (size_t p = path.find("%p"); p != std::string::npos)
        path.replace(p, 2, std::to_string(getpid()));
    {
        Env e("RSTREAM_RX_SIZE", "lots");
        for (int i = 0; i < 3; i++)
            EXPECT_EQ(getInt("RSTREAM_RX_SIZE"), 384);
    }
    {
        Env e("RSTREAM_RX_SIZE", "9000");
        EXPECT_EQ(getInt("RSTREAM_RX_SIZE"), 384);
    }
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::stringstream text;
    text << in.rdbuf();
    const std::string log = text.str();
    EXPECT_NE(log.find("warn: ignoring RSTREAM_RX_SIZE=lots: invalid or out of range"),
              std::string::npos)
        << log;
    size_t lines = 0;
    for (size_t at = 0; (at = log.find("ignoring RSTREAM_RX_SIZE=", at)) != std::string::npos; at++)
        lines++;
    EXPECT_EQ(lines, 1u) << log;
}

// ---- The documentation ------------------------------------------------------------------------

namespace {

struct Doc
{
    std::vector<std::string> names; // as one entry documents them, in order
    std::string defaults;           // the default cell, or the entry's text
    std::string text;               // all of the entry
};

std::string sourceRoot()
{
    const char *root = std::getenv("RSTREAM_SOURCE_ROOT");
    return root ? root : "(unset)";
}

std::string readSource(const std::string &relative)
{
    const char *root = std::getenv("RSTREAM_SOURCE_ROOT");
    if (!root)
        return {};
    std::ifstream in(std::string(root) + "/" + relative);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<std::string> variablesIn(const std::string &s)
{
    static const std::regex re("RSTREAM_[A-Z0-9_]*[A-Z0-9]");
    std::vector<std::string> out;
    for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it)
        out.push_back(it->str());
    return out;
}

// The README's table: rows "| `RSTREAM_A`, `RSTREAM_B` | meaning | default |".
std::vector<Doc> readmeTable(const std::string &readme)
{
    std::vector<Doc> out;
    std::istringstream in(readme);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("| `RSTREAM_", 0) != 0)
            continue;
        // Cells between the bars, trimmed (none of them holds a bar).
        std::vector<std::string> cells;
        std::istringstream row(line.substr(1));
        for (std::string cell; std::getline(row, cell, '|');) {
            const size_t first = cell.find_first_not_of(' ');
            cells.push_back(first == std::string::npos
                                ? std::string()
                                : cell.substr(first, cell.find_last_not_of(' ') - first + 1));
        }
        if (cells.size() != 3)
            continue;
        out.push_back({variablesIn(cells[0]), cells[2], line});
    }
    return out;
}

// man 7 rstream's ENVIRONMENT: ".TP", ".B NAME" or ".BR A \", \" B", then the text.
std::vector<Doc> manEnvironment(const std::string &man)
{
    std::vector<Doc> out;
    const size_t begin = man.find("\n.SH ENVIRONMENT\n");
    if (begin == std::string::npos)
        return out;
    const size_t end = man.find("\n.SH ", begin + 1);
    std::istringstream in(man.substr(begin + 1, end - begin - 1));
    std::string line;
    bool heading = false;
    while (std::getline(in, line)) {
        if (line == ".TP") {
            heading = true;
            continue;
        }
        if (line.rfind(".PP", 0) == 0 || line.rfind(".SH", 0) == 0) {
            heading = false;
            out.push_back({}); // text after it belongs to no variable
            continue;
        }
        if (heading) {
            heading = false;
            out.push_back({variablesIn(line), "", line});
            continue;
        }
        if (!out.empty()) {
            out.back().defaults += line + "\n";
            out.back().text += "\n" + line;
        }
    }
    return out;
}

// The documented default of each name of a doc: "a, b" pairs with two names, one serves all;
// the part before ';' counts ("20000; 0 on verbs").
std::vector<std::string> splitDefaults(const std::string &cell, size_t names)
{
    std::vector<std::string> parts;
    std::string s = cell.substr(0, cell.find(';'));
    for (size_t at = 0;;) {
        const size_t comma = s.find(", ", at);
        parts.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos)
            break;
        at = comma + 2;
    }
    if (parts.size() != names)
        parts.assign(names, parts[0]);
    return parts;
}

// "default X" in a man page entry, once per name or once for all.
std::vector<std::string> manDefaults(const std::string &text, size_t names)
{
    static const std::regex re("default ([^ ;,:)\\n]+)");
    std::vector<std::string> found;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
         ++it)
        found.push_back((*it)[1].str());
    if (found.empty())
        return {};
    if (found.size() != names)
        found.assign(names, found[0]);
    return found;
}

// A documented default against the table's: numbers and levels compare by value.
void expectDefault(const ConfigVar &v, const std::string &documented, const char *where)
{
    SCOPED_TRACE(std::string(where) + ": " + v.name + " documented default \"" + documented + "\"");
    if (v.kind == Kind::Text || !*v.defaultText)
        return; // "none", "all", "stderr": prose, not comparable
    int64_t doc = 0;
    ASSERT_EQ(parse(v, documented.c_str(), &doc), 0) << "not a valid value";
    EXPECT_EQ(doc, defaultValue(v)) << "the table says " << v.defaultText;
}

// "A to B" in a doc: the range, compared with the table's.
void expectRange(const ConfigVar &v, const std::string &text, const char *where)
{
    static const std::regex re("([0-9][0-9a-z]*) to ([0-9][0-9a-z]*)");
    std::smatch m;
    if (v.kind == Kind::Text || v.kind == Kind::Flag || !std::regex_search(text, m, re))
        return;
    SCOPED_TRACE(std::string(where) + ": " + v.name + " documented range " + m[0].str());
    uint64_t lo, hi;
    ASSERT_EQ(parseSize(m[1].str().c_str(), &lo), 0);
    ASSERT_EQ(parseSize(m[2].str().c_str(), &hi), 0);
    EXPECT_EQ(int64_t(lo), v.min);
    EXPECT_EQ(int64_t(hi), v.max);
}

// Checks one document: every table variable is there, every variable there is in the table,
// defaults and ranges agree.
void checkDocument(const std::vector<Doc> &docs, bool man, const char *where)
{
    ASSERT_FALSE(docs.empty()) << where << ": no variables found (RSTREAM_SOURCE_ROOT?)";
    std::set<std::string> documented;
    for (const Doc &d : docs) {
        for (const std::string &name : variablesIn(d.text)) {
            documented.insert(name);
            EXPECT_NE(find(name), nullptr) << where << " documents " << name
                                           << ", which the libraries do not read (or the table "
                                              "lacks)";
        }
        const std::vector<std::string> defaults = man ? manDefaults(d.defaults, d.names.size())
                                                      : splitDefaults(d.defaults, d.names.size());
        for (size_t i = 0; i < d.names.size(); i++) {
            const ConfigVar *v = find(d.names[i]);
            if (!v)
                continue;
            if (i < defaults.size())
                expectDefault(*v, defaults[i], where);
            else if (v->kind != Kind::Text && *v->defaultText)
                ADD_FAILURE() << where << ": " << v->name << " has no documented default";
            expectRange(*v, d.text, where);
        }
    }
    for (const ConfigVar &v : vars())
        EXPECT_TRUE(documented.count(v.name)) << where << " does not document " << v.name;
}

} // namespace

TEST(ConfigDocs, ReadmeTableMatchesTheRegistry)
{
    const std::string readme = readSource("README.md");
    ASSERT_FALSE(readme.empty()) << "README.md not found; RSTREAM_SOURCE_ROOT=" << sourceRoot();
    checkDocument(readmeTable(readme), false, "README.md");
}

TEST(ConfigDocs, ManPageEnvironmentMatchesTheRegistry)
{
    const std::string man = readSource("man/rstream.7");
    ASSERT_FALSE(man.empty()) << "man/rstream.7 not found; RSTREAM_SOURCE_ROOT=" << sourceRoot();
    checkDocument(manEnvironment(man), true, "man/rstream.7");
}
