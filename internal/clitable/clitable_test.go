package clitable

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestTabAligns(t *testing.T) {
	tab := NewTab("ID", "BLOCKS", "STATE")
	tab.Add("enginesim-a", 12, "ACTIVE")
	tab.Add("b", 3456, "DRAIN\tING")
	var b bytes.Buffer
	if _, err := tab.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"ID            BLOCKS   STATE\n" +
		"enginesim-a   12       ACTIVE\n" +
		"b             3456     DRAIN ING\n"
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestWriteFormats(t *testing.T) {
	doc := struct {
		Name   string `json:"name"`
		Blocks int    `json:"blocks"`
	}{"w", 7}
	table := func(w io.Writer) error { _, err := io.WriteString(w, "TABLE\n"); return err }
	for _, c := range []struct {
		f    Format
		want string
	}{
		{JSON, "{\n  \"name\": \"w\",\n  \"blocks\": 7\n}\n"},
		{YAML, "blocks: 7\nname: w\n"},
		{Table, "TABLE\n"},
	} {
		var b bytes.Buffer
		if err := Write(&b, c.f, doc, table); err != nil {
			t.Fatal(err)
		}
		if b.String() != c.want {
			t.Errorf("%s: %q, want %q", c.f, b.String(), c.want)
		}
	}
	if err := Write(io.Discard, "xml", doc, table); !errors.Is(err, ErrUnknownFormat) {
		t.Fatalf("xml: %v", err)
	}
}

func TestParseFormat(t *testing.T) {
	for in, want := range map[string]Format{"": Table, "TABLE": Table, "json": JSON, "yml": YAML, "yaml": YAML} {
		if f, err := ParseFormat(in); err != nil || f != want {
			t.Errorf("%q: %v %v", in, f, err)
		}
	}
	_, err := ParseFormat("wide")
	if !errors.Is(err, ErrUnknownFormat) || !strings.Contains(err.Error(), "table, json or yaml") {
		t.Fatalf("wide: %v", err)
	}
}

func TestHumanUnits(t *testing.T) {
	ages := map[time.Duration]string{
		-time.Second: "0s", 850 * time.Millisecond: "850ms", 42 * time.Second: "42s",
		192 * time.Second: "3m12s", 5*time.Hour + 3*time.Minute: "5h3m", 52 * time.Hour: "2d4h",
	}
	for d, want := range ages {
		if got := Age(d); got != want {
			t.Errorf("Age(%v) = %q, want %q", d, got, want)
		}
	}
	if Percent(32, 37) != "86.5%" || Percent(1, 0) != "-" {
		t.Errorf("Percent: %q %q", Percent(32, 37), Percent(1, 0))
	}
	if Bytes(512) != "512 B" || Bytes(12*1024) != "12.0 KiB" || Bytes(3<<30) != "3.0 GiB" {
		t.Errorf("Bytes: %q %q %q", Bytes(512), Bytes(12*1024), Bytes(3<<30))
	}
	if Millis(12.345) != "12.3" {
		t.Errorf("Millis: %q", Millis(12.345))
	}
}

func TestTabTrimsTrailingSpace(t *testing.T) {
	tab := NewTab("A", "")
	tab.Add("x", "")
	tab.Add("longer", "pick")
	var b bytes.Buffer
	tab.WriteTo(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasSuffix(l, " ") {
			t.Fatalf("trailing space in %q", l)
		}
	}
	if !strings.Contains(b.String(), "longer   pick\n") {
		t.Fatalf("table:\n%s", b.String())
	}
}
