//! `gpumem top`: a terminal UI of the GPUs and the gpumem pools inside them, keyboard only
//! (works over SSH). Per GPU: memory used of total with the pools' allocated and reserved
//! parts drawn inside it, and a utilisation sparkline; below, one row per process (pid, user,
//! host CPU, command, memory, pool policy, fragmentation) that can be sorted and selected to show its
//! pool status and last OOM explanation.
//!
//! Keys: `s` next sort column, `↑`/`↓` (or `k`/`j`) select, `Enter` show or hide the
//! selected process's pool, `Esc` hide it, `q` quit.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use gpumem_pool::Bytes;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table, TableState, Wrap};
use ratatui::Frame;

use crate::{GpuSample, PoolSample, Sample, SampleSource, WatchError};

/// Samples of utilisation kept per GPU for the sparkline.
const HISTORY: usize = 240;

/// The column the process rows are sorted by (descending for amounts, ascending for ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    /// Device memory held, largest first.
    Memory,
    /// Pool fragmentation, largest first.
    Fragmentation,
    /// Process id.
    Pid,
    /// GPU index.
    Gpu,
}

impl SortBy {
    fn next(self) -> SortBy {
        match self {
            SortBy::Memory => SortBy::Fragmentation,
            SortBy::Fragmentation => SortBy::Pid,
            SortBy::Pid => SortBy::Gpu,
            SortBy::Gpu => SortBy::Memory,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SortBy::Memory => "memory",
            SortBy::Fragmentation => "fragmentation",
            SortBy::Pid => "pid",
            SortBy::Gpu => "gpu",
        }
    }
}

/// One process on one GPU: what NVML says of it joined with its pool, if it publishes one.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRow {
    /// Process id.
    pub pid: u32,
    /// GPU index.
    pub gpu: u32,
    /// Owner.
    pub user: String,
    /// Command line.
    pub command: String,
    /// Device memory held (NVML), else the pool's reserved bytes.
    pub memory: u64,
    /// Host CPU use, percent of one core, when known.
    pub cpu_percent: Option<f64>,
    /// The pool, when the process publishes one for this GPU.
    pub pool: Option<PoolSample>,
}

/// What the UI shows: the latest sample, history and the user's choices. Separate from the
/// terminal so that it can be driven by tests.
pub struct App {
    sample: Sample,
    history: BTreeMap<u32, VecDeque<u64>>,
    rows: Vec<ProcessRow>,
    sort: SortBy,
    table: TableState,
    detail: bool,
    /// A line about the source (e.g. why no GPU is seen), shown all along.
    note: Option<String>,
    /// The latest news, on its own line under the note (an endpoint skipped, the end of a
    /// recording), so that a long note never hides it.
    news: Option<String>,
}

impl Default for App {
    fn default() -> Self {
        App::new()
    }
}

impl App {
    /// An empty view.
    pub fn new() -> App {
        App {
            sample: Sample::default(),
            history: BTreeMap::new(),
            rows: Vec::new(),
            sort: SortBy::Memory,
            table: TableState::default(),
            detail: false,
            note: None,
            news: None,
        }
    }

    /// Shows `note` under the title (why no GPU is seen).
    pub fn set_note(&mut self, note: Option<String>) {
        self.note = note;
    }

    /// Shows `news` on a line of its own under the note, replacing the previous news (an
    /// endpoint skipped, the end of a recording).
    pub fn set_news(&mut self, news: Option<String>) {
        self.news = news;
    }

    /// Takes in a new sample, keeping the selected process selected.
    pub fn update(&mut self, sample: Sample) {
        for gpu in &sample.gpus {
            let history = self.history.entry(gpu.index).or_default();
            if history.len() == HISTORY {
                history.pop_front();
            }
            history.push_back(gpu.gpu_util.round() as u64);
        }
        let selected = self.selected().map(|r| (r.pid, r.gpu));
        self.rows = process_rows(&sample);
        self.sample = sample;
        self.sort_rows(selected);
    }

    /// The process rows, in display order.
    pub fn rows(&self) -> &[ProcessRow] {
        &self.rows
    }

    /// The selected row.
    pub fn selected(&self) -> Option<&ProcessRow> {
        self.table.selected().and_then(|i| self.rows.get(i))
    }

    /// Handles a key; returns `false` when the user quits.
    pub fn key(&mut self, key: KeyCode) -> bool {
        match key {
            KeyCode::Char('q') => return false,
            KeyCode::Char('s') => {
                self.sort = self.sort.next();
                let selected = self.selected().map(|r| (r.pid, r.gpu));
                self.sort_rows(selected);
            }
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Enter => self.detail = !self.detail && self.selected().is_some(),
            KeyCode::Esc => self.detail = false,
            _ => {}
        }
        true
    }

    fn move_selection(&mut self, by: isize) {
        if self.rows.is_empty() {
            return;
        }
        let last = self.rows.len() as isize - 1;
        let next = self
            .table
            .selected()
            .map_or(0, |i| (i as isize + by).clamp(0, last));
        self.table.select(Some(next as usize));
    }

    fn sort_rows(&mut self, keep: Option<(u32, u32)>) {
        let fragmentation = |r: &ProcessRow| r.pool.as_ref().map_or(0.0, PoolSample::fragmentation);
        match self.sort {
            SortBy::Memory => self
                .rows
                .sort_by(|a, b| b.memory.cmp(&a.memory).then(a.pid.cmp(&b.pid))),
            SortBy::Fragmentation => self.rows.sort_by(|a, b| {
                fragmentation(b)
                    .total_cmp(&fragmentation(a))
                    .then(a.pid.cmp(&b.pid))
            }),
            SortBy::Pid => self.rows.sort_by_key(|r| (r.pid, r.gpu)),
            SortBy::Gpu => self.rows.sort_by_key(|r| (r.gpu, r.pid)),
        }
        let position = keep.and_then(|k| self.rows.iter().position(|r| (r.pid, r.gpu) == k));
        self.table
            .select(position.or(if self.rows.is_empty() { None } else { Some(0) }));
    }

    /// Draws the whole UI into `frame`.
    pub fn draw(&mut self, frame: &mut Frame) {
        let gpu_height = 4 * self.sample.gpus.len().max(1) as u16;
        let title_height = 1 + u16::from(self.note.is_some()) + u16::from(self.news.is_some());
        let [title, gpus, processes, footer] = Layout::vertical([
            Constraint::Length(title_height.max(2)),
            Constraint::Length(gpu_height),
            Constraint::Min(4),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        self.draw_title(frame, title);
        self.draw_gpus(frame, gpus);
        if self.detail {
            let [table, detail] =
                Layout::vertical([Constraint::Percentage(40), Constraint::Percentage(60)])
                    .areas(processes);
            self.draw_processes(frame, table);
            self.draw_detail(frame, detail);
        } else {
            self.draw_processes(frame, processes);
        }
        frame.render_widget(
            Paragraph::new(format!(
                " q quit   s sort ({})   ↑/↓ select   Enter pool status and last OOM   Esc close",
                self.sort.name()
            ))
            .style(Style::new().add_modifier(Modifier::REVERSED)),
            footer,
        );
    }

    fn draw_title(&self, frame: &mut Frame, area: Rect) {
        let host = if self.sample.host.is_empty() {
            "this host"
        } else {
            &self.sample.host
        };
        let mut lines = vec![Line::from(vec![
            Span::styled("gpumem top", Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(format!(
                " — {host} — {} GPU(s), {} pool(s) — sorted by {}",
                self.sample.gpus.len(),
                self.sample.pools.len(),
                self.sort.name()
            )),
        ])];
        for line in self.note.iter().chain(&self.news) {
            lines.push(Line::styled(line.clone(), Style::new().fg(Color::Yellow)));
        }
        frame.render_widget(Paragraph::new(lines), area);
    }

    fn draw_gpus(&self, frame: &mut Frame, area: Rect) {
        if self.sample.gpus.is_empty() {
            frame.render_widget(
                Paragraph::new("No GPU figures (no NVIDIA driver, or none in the recording)."),
                area,
            );
            return;
        }
        let areas =
            Layout::vertical(vec![Constraint::Length(4); self.sample.gpus.len()]).split(area);
        for (gpu, area) in self.sample.gpus.iter().zip(areas.iter()) {
            let [text, spark] =
                Layout::horizontal([Constraint::Min(40), Constraint::Length(32)]).areas(*area);
            let pools: Vec<&PoolSample> = self
                .sample
                .pools
                .iter()
                .filter(|p| p.device == gpu.index)
                .collect();
            let allocated: u64 = pools.iter().map(|p| p.allocated).sum();
            let reserved: u64 = pools.iter().map(|p| p.reserved).sum();
            let bar_width = text.width.saturating_sub(2) as usize;
            let lines = vec![
                Line::from(vec![
                    Span::styled(
                        format!("GPU {} ", gpu.index),
                        Style::new().add_modifier(Modifier::BOLD),
                    ),
                    Span::raw(format!(
                        "{}  util {:>3.0} %  mem {} / {}  {:.0} W  PCIe rx {:.1} tx {:.1} GB/s",
                        gpu.name,
                        gpu.gpu_util,
                        Bytes(gpu.memory_used),
                        Bytes(gpu.memory_total),
                        gpu.power_watts,
                        gpu.pcie_rx_bytes_per_s as f64 / 1e9,
                        gpu.pcie_tx_bytes_per_s as f64 / 1e9
                    )),
                ]),
                memory_bar(gpu, allocated, reserved, bar_width),
                Line::raw(format!(
                    "pools: {} allocated, {} reserved (█ allocated ▒ pool cache ░ other used)",
                    Bytes(allocated),
                    Bytes(reserved)
                )),
            ];
            frame.render_widget(Paragraph::new(lines), text);
            let history: Vec<u64> = self
                .history
                .get(&gpu.index)
                .map(|h| {
                    h.iter()
                        .rev()
                        .take(spark.width.saturating_sub(2) as usize)
                        .rev()
                        .copied()
                        .collect()
                })
                .unwrap_or_default();
            frame.render_widget(
                Sparkline::default()
                    .block(
                        Block::new()
                            .borders(Borders::LEFT | Borders::RIGHT)
                            .title(format!("util GPU {}", gpu.index)),
                    )
                    .data(&history)
                    .max(100)
                    .style(Style::new().fg(Color::Green)),
                spark,
            );
        }
    }

    fn draw_processes(&mut self, frame: &mut Frame, area: Rect) {
        let header = Row::new([
            "PID",
            "USER",
            "GPU",
            "CPU",
            "MEMORY",
            "POLICY",
            "ALLOCATED",
            "RESERVED",
            "FRAG",
            "COMMAND",
        ])
        .style(Style::new().add_modifier(Modifier::BOLD));
        let rows = self.rows.iter().map(|r| {
            let (policy, allocated, reserved, fragmentation) = match &r.pool {
                Some(p) => (
                    p.policy.clone(),
                    Bytes(p.allocated).to_string(),
                    Bytes(p.reserved).to_string(),
                    format!("{:.0} %", 100.0 * p.fragmentation()),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            Row::new(vec![
                Cell::from(r.pid.to_string()),
                Cell::from(r.user.clone()),
                Cell::from(r.gpu.to_string()),
                Cell::from(r.cpu_percent.map_or("-".into(), |c| format!("{c:.0} %"))),
                Cell::from(Bytes(r.memory).to_string()),
                Cell::from(policy),
                Cell::from(allocated),
                Cell::from(reserved),
                Cell::from(fragmentation),
                Cell::from(r.command.clone()),
            ])
        });
        let widths = [
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(4),
            Constraint::Length(6),
            Constraint::Length(11),
            Constraint::Length(11),
            Constraint::Length(11),
            Constraint::Length(11),
            Constraint::Length(6),
            Constraint::Min(10),
        ];
        let table = Table::new(rows, widths)
            .header(header)
            .block(
                Block::new()
                    .borders(Borders::TOP)
                    .title(format!("processes ({})", self.rows.len())),
            )
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .highlight_symbol("> ");
        frame.render_stateful_widget(table, area, &mut self.table);
    }

    fn draw_detail(&self, frame: &mut Frame, area: Rect) {
        let Some(row) = self.selected() else { return };
        let title = format!("pid {} on GPU {}", row.pid, row.gpu);
        let text = match &row.pool {
            None => {
                "This process publishes no gpumem pool (run it with GPUMEM_PUBLISH=1).".to_string()
            }
            Some(pool) => format!(
                "{}\nOOMs: {}\n\nLast OOM: {}",
                pool.status,
                pool.num_ooms,
                pool.last_oom.as_deref().unwrap_or("none")
            ),
        };
        frame.render_widget(
            Paragraph::new(text)
                .wrap(Wrap { trim: false })
                .block(Block::new().borders(Borders::ALL).title(title)),
            area,
        );
    }
}

/// The memory bar of one GPU: the pools' allocated bytes, their cache (reserved but not
/// allocated), memory others use, and free, in proportion.
fn memory_bar(gpu: &GpuSample, allocated: u64, reserved: u64, width: usize) -> Line<'static> {
    let total = gpu.memory_total.max(1) as f64;
    let cells = |bytes: u64| ((bytes as f64 / total) * width as f64).round() as usize;
    let a = cells(allocated).min(width);
    let c = cells(reserved.saturating_sub(allocated)).min(width - a);
    let o = cells(gpu.memory_used.saturating_sub(reserved)).min(width - a - c);
    let free = width - a - c - o;
    Line::from(vec![
        Span::raw("["),
        Span::styled("█".repeat(a), Style::new().fg(Color::Green)),
        Span::styled("▒".repeat(c), Style::new().fg(Color::Yellow)),
        Span::styled("░".repeat(o), Style::new().fg(Color::Blue)),
        Span::raw(" ".repeat(free)),
        Span::raw("]"),
    ])
}

/// NVML's processes joined with the published pools by (pid, GPU); a pool whose process NVML
/// does not list (no driver, or a recording of pools only) still gets a row.
fn process_rows(sample: &Sample) -> Vec<ProcessRow> {
    let mut rows: Vec<ProcessRow> = sample
        .gpus
        .iter()
        .flat_map(|gpu| {
            gpu.processes.iter().map(|p| ProcessRow {
                pid: p.pid,
                gpu: gpu.index,
                user: p.user.clone(),
                command: p.command.clone(),
                memory: p.memory.unwrap_or(0),
                cpu_percent: p.cpu_percent,
                pool: sample
                    .pools
                    .iter()
                    .find(|pool| pool.pid == p.pid && pool.device == gpu.index)
                    .cloned(),
            })
        })
        .collect();
    for pool in &sample.pools {
        if !rows
            .iter()
            .any(|r| r.pid == pool.pid && r.gpu == pool.device)
        {
            rows.push(ProcessRow {
                pid: pool.pid,
                gpu: pool.device,
                user: String::new(),
                command: String::new(),
                memory: pool.reserved,
                cpu_percent: None,
                pool: Some(pool.clone()),
            });
        }
    }
    rows
}

/// Runs the UI on the terminal until the user quits: a new sample every `interval`; a
/// recording's last sample stays on screen when it ends.
pub fn run(
    mut source: Box<dyn SampleSource + Send>,
    note: Option<String>,
    interval: Duration,
) -> Result<(), WatchError> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return Err(WatchError::io(
            "stdout",
            std::io::Error::other(
                "gpumem top needs a terminal; for text, use gpumem diagnose or gpumem exporter",
            ),
        ));
    }
    let mut app = App::new();
    app.set_note(note);
    let mut look = |app: &mut App| -> Result<(), WatchError> {
        let sample = source.next_sample()?;
        if let Some(warning) = source.take_warnings().pop() {
            app.set_news(Some(warning.to_string()));
        }
        match sample {
            Some(sample) => app.update(sample),
            None => app.set_news(Some(
                "end of recording: showing its last sample".to_string(),
            )),
        }
        Ok(())
    };
    look(&mut app)?;
    let mut terminal = ratatui::try_init().map_err(|e| WatchError::io("terminal", e))?;
    let result = (|| -> Result<(), WatchError> {
        let mut next = Instant::now() + interval;
        loop {
            terminal
                .draw(|frame| app.draw(frame))
                .map_err(|e| WatchError::io("terminal", e))?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait).map_err(|e| WatchError::io("terminal", e))? {
                if let Event::Key(key) = event::read().map_err(|e| WatchError::io("terminal", e))? {
                    if key.kind == KeyEventKind::Press && !app.key(key.code) {
                        return Ok(());
                    }
                }
            }
            if Instant::now() >= next {
                next = Instant::now() + interval;
                look(&mut app)?;
            }
        }
    })();
    ratatui::restore();
    result
}
