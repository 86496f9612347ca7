package auth

import "encoding/json"

// ReachesHistory reports whether t may see an operation's history, given
// as the audit trail's lines about it: a token of every namespace always;
// a token of one namespace when some event names a session and every
// session named is in its namespace (events that name none, such as a
// forget, go with the rest). An unreadable line: false.
func (t *Token) ReachesHistory(lines [][]byte) bool {
	if t.Namespace == AllNamespaces {
		return true
	}
	named := false
	for _, line := range lines {
		var e struct {
			Event struct {
				Session *string `json:"session"`
			} `json:"event"`
		}
		if json.Unmarshal(line, &e) != nil {
			return false
		}
		if sess := e.Event.Session; sess != nil {
			if !t.Reaches(*sess) {
				return false
			}
			named = true
		}
	}
	return named
}
