package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSinkLogsTheFiring(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	s := &sink{log: json.NewEncoder(&buf), seen: map[string]int{}}
	post := func(h map[string]string) {
		req := httptest.NewRequest(http.MethodPost, "/ops", strings.NewReader(`{"op":"op-1"}`))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		s.receive(rec, req)
		require.Equal(t, http.StatusOK, rec.Code)
	}
	post(map[string]string{"Idempotency-Key": "k1", "Idem-Tool": "chaos_op", "Idem-Holder": "w2.3", "Idem-Attempt": "2"})
	post(map[string]string{"Idempotency-Key": "k1", "Idem-Attempt": "two"})

	var got []entry
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var e entry
		require.NoError(t, dec.Decode(&e))
		got = append(got, e)
	}
	require.Len(t, got, 2)
	require.Equal(t, "w2.3", got[0].Holder)
	require.Equal(t, 2, got[0].Attempt)
	require.Equal(t, "chaos_op", got[0].Tool)
	require.JSONEq(t, `{"op":"op-1"}`, string(got[0].Payload))
	require.Empty(t, got[1].Holder)
	require.Zero(t, got[1].Attempt, "an attempt that is not a number is logged as none")
	require.True(t, got[1].Repeat)
}

func TestSinkAnswersProbes(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	s := &sink{log: json.NewEncoder(&buf), seen: map[string]int{}, answers: map[string][]byte{}}
	probe := func(target string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		s.probe(rec, httptest.NewRequest(http.MethodGet, target, nil))
		return rec
	}
	require.Equal(t, http.StatusNotFound, probe("/probe?key=k1").Code, "nothing performed yet")
	req := httptest.NewRequest(http.MethodPost, "/refunds", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k1")
	first := httptest.NewRecorder()
	s.receive(first, req)
	require.Equal(t, http.StatusOK, first.Code)

	got := probe("/probe?key=k1")
	require.Equal(t, http.StatusOK, got.Code)
	require.JSONEq(t, first.Body.String(), got.Body.String(), "the probe answers what the request was answered")
	require.Equal(t, http.StatusNotFound, probe("/probe?key=k2").Code)
	require.Equal(t, http.StatusServiceUnavailable, probe("/probe?key=k1&mode=unknown").Code)
	require.Equal(t, 1, s.requests, "a probe is not a request")
	require.Equal(t, 1, strings.Count(buf.String(), "\n"), "nor logged")
}
