package logbuf

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// sink records each Write it gets.
type sink struct {
	mu     sync.Mutex
	writes []string
	err    error
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, string(p))
	return len(p), s.err
}

func (s *sink) all() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.writes, ""), len(s.writes)
}

func TestLinesAreBatchedAndKeptInOrder(t *testing.T) {
	s := &sink{}
	w := New(s, 1024, time.Hour)
	for i := range 10 {
		fmt.Fprintf(w, "line %d\n", i)
	}
	if _, n := s.all(); n != 0 {
		t.Fatalf("%d writes before any flush; want 0", n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, n := s.all()
	if n != 1 {
		t.Errorf("%d writes for 10 small lines; want 1", n)
	}
	var want strings.Builder
	for i := range 10 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if got != want.String() {
		t.Errorf("got %q, want %q", got, want.String())
	}
}

func TestIntervalFlushes(t *testing.T) {
	s := &sink{}
	w := New(s, 1024, 10*time.Millisecond)
	defer w.Close()
	_, _ = w.Write([]byte("hello\n"))
	testpoll.Until(t, 5*time.Second, "the timer flushes the line", func() bool {
		got, _ := s.all()
		return got == "hello\n"
	})
}

func TestFullBufferFlushesFirstAndLargeLinesGoThrough(t *testing.T) {
	s := &sink{}
	w := New(s, 16, time.Hour)
	_, _ = w.Write([]byte("0123456789\n"))          // 11 bytes, buffered
	_, _ = w.Write([]byte("abcdefghij\n"))          // does not fit: flush, then buffered
	_, _ = w.Write([]byte(strings.Repeat("x", 40))) // larger than the buffer
	got, n := s.all()
	if n != 3 || got != "0123456789\nabcdefghij\n"+strings.Repeat("x", 40) {
		t.Fatalf("got %d writes %q", n, got)
	}
	_ = w.Close()
}

func TestConcurrentWritesStayWhole(t *testing.T) {
	s := &sink{}
	w := New(s, 256, time.Millisecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				fmt.Fprintf(w, "g%d-%03d|\n", g, i)
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ := s.all()
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) != 8*500 {
		t.Fatalf("%d lines; want %d", len(lines), 8*500)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		if len(l) != 7 || !strings.HasSuffix(l, "|") || seen[l] {
			t.Fatalf("torn or repeated line %q", l)
		}
		seen[l] = true
	}
}

func TestErrorsAreReportedAndWritesAfterCloseGoThrough(t *testing.T) {
	s := &sink{err: errors.New("disk full")}
	w := New(s, 64, time.Hour)
	_, _ = w.Write([]byte("a\n"))
	if err := w.Flush(); err == nil || err.Error() != "disk full" {
		t.Fatalf("Flush = %v; want the sink's error", err)
	}
	s.mu.Lock()
	s.err = nil
	s.mu.Unlock()
	_ = w.Close()
	var buf bytes.Buffer
	w2 := New(&buf, 64, time.Hour)
	_ = w2.Close()
	_, _ = w2.Write([]byte("late\n"))
	if buf.String() != "late\n" {
		t.Errorf("write after Close: got %q", buf.String())
	}
}
