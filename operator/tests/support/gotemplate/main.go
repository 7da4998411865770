// Renders a chart the way Helm's engine does (Go's text/template with
// Sprig's functions, Helm's include and toYaml, missingkey=zero and
// "<no value>" removed), for the values and release a case directory of
// target/chart-render/ holds: the reference operator/tests/chart.rs
// compares its own renderer with (`--ignored go_template`; needs Debian's
// golang-go, golang-github-masterminds-sprig-dev, golang-gopkg-yaml.v2-dev).
//
// Usage: main CHART_DIR CASE_DIR OUT_DIR
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v2"
)

type Files map[string][]byte

func (f Files) Get(name string) string { return string(f[name]) }

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	chartDir, caseDir, outDir := os.Args[1], os.Args[2], os.Args[3]
	var values map[string]interface{}
	b, err := os.ReadFile(filepath.Join(caseDir, "values.json"))
	must(err)
	must(json.Unmarshal(b, &values))
	var rel map[string]string
	b, err = os.ReadFile(filepath.Join(caseDir, "release.json"))
	must(err)
	must(json.Unmarshal(b, &rel))
	var meta map[string]interface{}
	b, err = os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	must(err)
	must(yaml.Unmarshal(b, &meta))
	chart := map[string]interface{}{}
	for k, v := range meta {
		key := strings.ToUpper(k[:1]) + k[1:]
		if k == "apiVersion" {
			key = "APIVersion"
		}
		chart[key] = v
	}
	files := Files{}
	filepath.Walk(chartDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			rel, _ := filepath.Rel(chartDir, p)
			data, _ := os.ReadFile(p)
			files[rel] = data
		}
		return nil
	})
	t := template.New("gotpl")
	t.Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = func(v interface{}) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(data), "\n")
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	t.Funcs(funcs)
	var names []string
	for name := range files {
		if strings.HasPrefix(name, "templates/") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		_, err := t.New(name).Parse(string(files[name]))
		must(err)
	}
	root := map[string]interface{}{
		"Values":  values,
		"Chart":   chart,
		"Files":   files,
		"Release": map[string]interface{}{"Name": rel["name"], "Namespace": rel["namespace"], "Service": "Helm", "IsInstall": true, "IsUpgrade": false, "Revision": 1},
	}
	for _, name := range names {
		if strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		var buf strings.Builder
		must(t.ExecuteTemplate(&buf, name, root))
		out := strings.ReplaceAll(buf.String(), "<no value>", "")
		p := filepath.Join(outDir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		must(os.WriteFile(p, []byte(out), 0o644))
	}
}
